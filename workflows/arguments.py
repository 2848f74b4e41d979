"""Arguments the workflow refuses before dispatch: what every version of the turn agrees on.

``argument_problem`` (``tooltrail.core.text``) says why a call's arguments cannot be
dispatched; since the ``tooltrail-finite-arguments`` patch a non-finite number is one of the
reasons. Python's ``json`` reads the model's ``NaN`` and ``Infinity``, but JSON has no such
numbers and tooltrail's canonical encoder refuses them: without this check they reached the
tool's guardrails.

Since the ``tooltrail-deep-arguments`` patch, raw JSON text nested deeper than
``MAX_ARGUMENT_DEPTH`` is refused as such before it is parsed: Python's parser gives up at
about a thousand levels (``RecursionError``), and the model read "not valid JSON" about text
that was valid, only too deep. Turns recorded before either patch replay as they ran.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from tooltrail.core.text import (
    NON_FINITE_ARGUMENTS,
    TOO_DEEP,
    argument_problem,
    holds_non_finite,
    invalid_arguments,
    text_nesting_exceeds,
)

__all__ = ["DEEP_ARGUMENTS_PATCH", "FINITE_ARGUMENTS_PATCH", "refused_arguments", "refused_text"]

FINITE_ARGUMENTS_PATCH = "tooltrail-finite-arguments"
"""``workflow.patched`` id of refusing non-finite numbers in arguments."""

DEEP_ARGUMENTS_PATCH = "tooltrail-deep-arguments"
"""``workflow.patched`` id of refusing raw JSON text nested too deep before parsing it."""


def refused_arguments(arguments: dict[str, Any], max_bytes: int) -> str | None:
    """The soft error text for arguments the turn refuses, or ``None``.

    The patch is asked only when a non-finite number is there, so the histories of every
    other turn carry no marker.
    """
    problem = argument_problem(arguments, max_bytes)
    if problem is None and holds_non_finite(arguments) and workflow.patched(FINITE_ARGUMENTS_PATCH):
        return invalid_arguments(NON_FINITE_ARGUMENTS)
    return problem


def refused_text(arguments: str) -> str | None:
    """The soft error text for raw JSON arguments nested too deep to parse, or ``None``.

    Read before the text is parsed. The patch is asked only when the text nests too deep, so
    the histories of every other turn carry no marker.
    """
    if text_nesting_exceeds(arguments) and workflow.patched(DEEP_ARGUMENTS_PATCH):
        return invalid_arguments(TOO_DEEP)
    return None
