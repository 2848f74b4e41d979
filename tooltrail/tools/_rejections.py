"""Guardrail rejections: ``ArgumentsRejected`` and its soft ``guardrail violation: ...`` text.

``GUARDRAIL_PREFIX`` starts every such text; ``guardrail_text`` renders a pydantic
validation error as one, naming fields and reasons, never values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import ValidationError

__all__ = ["GUARDRAIL_PREFIX", "ArgumentsRejected", "guardrail_text"]

GUARDRAIL_PREFIX = "guardrail violation: "
"""Every guardrail rejection text starts with this."""

_REASONS = {
    "missing": "field required",
    "int_parsing": "not a valid integer",
    "int_type": "not a valid integer",
    "int_from_float": "not a valid integer",
    "float_parsing": "not a valid number",
    "float_type": "not a valid number",
    "finite_number": "not a finite number",
    "bool_parsing": "not a valid boolean",
    "bool_type": "not a valid boolean",
    "string_type": "not a valid string",
    "dict_type": "not a valid object",
    "model_type": "not a valid object",
    "list_type": "not a valid list",
}


def _validation_items(error: ValidationError) -> list[str]:
    items: list[str] = []
    for err in error.errors(include_input=False, include_url=False):
        location = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        ctx = err.get("ctx") or {}
        kind = err["type"]
        if kind == "string_too_long":
            reason = f"longer than {ctx.get('max_length')} characters"
        elif kind == "string_too_short":
            reason = f"shorter than {ctx.get('min_length')} characters"
        elif kind == "extra_forbidden":
            reason = "unexpected argument"
        else:
            reason = _REASONS.get(kind) or str(err["msg"]).lower()
        items.append(f"{location}: {reason}")
    return items


def guardrail_text(error: ValidationError) -> str:
    """Render a validation error as the soft ``guardrail violation: ...`` text.

    Offending values are never echoed: the text names fields and reasons only.
    """
    return GUARDRAIL_PREFIX + "; ".join(_validation_items(error))


class ArgumentsRejected(Exception):
    """Raised by ``validate`` when the arguments fail a guardrail; carries the soft text.

    ``str(e)`` is the model-facing ``guardrail violation: <field>: <reason>; ...`` text.
    """

    def __init__(
        self,
        text: str,
        *,
        items: Iterable[str] = (),
        stage: Literal["raw", "materialize", "effective", "freeze"] | None = None,
        ignored_arguments: Iterable[str] = (),
    ) -> None:
        """Create the rejection.

        Args:
            text: the soft text.
            items: its ``<field>: <reason>`` items.
            stage: the step that rejected: ``raw`` (3a), ``materialize`` (3b),
                ``effective`` (3c) or ``freeze`` (3d).
            ignored_arguments: undeclared argument names seen before the rejection.
        """
        super().__init__(text)
        self.text = text
        self.items = tuple(items)
        self.stage = stage
        self.ignored_arguments = tuple(ignored_arguments)

    @classmethod
    def of(
        cls,
        items: Iterable[str],
        *,
        stage: Literal["raw", "materialize", "effective", "freeze"],
        ignored_arguments: Iterable[str] = (),
    ) -> ArgumentsRejected:
        """Build the rejection whose text joins ``items`` with ``"; "``."""
        items = tuple(items)
        return cls(
            GUARDRAIL_PREFIX + "; ".join(items),
            items=items,
            stage=stage,
            ignored_arguments=ignored_arguments,
        )
