"""The heartbeat details of a tool attempt: one shared, mutable set per attempt.

Temporal keeps only the latest heartbeat details of an activity and hands them to its next
Temporal attempt (``activity.info().heartbeat_details``). Several places heartbeat during one
tool attempt (the attempt's own beat, the idempotency lease's renewals, the body journal);
if each sent details of its own, the last one would erase what the others recorded. So the
attempt keeps its details in one ``AttemptDetails`` (a context variable, seen by every task
the attempt starts), and every heartbeat sends all of it.

The details are ``(BODY_STARTED, marks)`` once the body may have started, ``(marks,)``
before: ``BODY_STARTED`` is what attempts recorded before the marks existed (old histories
and workers read it alone), ``marks`` a JSON object (``tooltrail.activities.body_journal``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from temporalio import activity

__all__ = ["BODY_STARTED", "AttemptDetails", "attempt_details", "beat", "current_details"]

BODY_STARTED = "body-started"
"""Heartbeat detail while a tool body may be running; a retried attempt reads it back to
tell a lost worker's interrupted body (``retry_on_interrupt=False``) from a clean retry."""


class AttemptDetails:
    """What one tool attempt tells its Temporal retries (the marks of its heartbeats)."""

    def __init__(self) -> None:
        """Start with no marks, before the body."""
        self.marks: dict[str, Any] = {}
        self.body_started = False
        """Set when the body may be running (then every beat says ``BODY_STARTED``)."""

    def details(self) -> tuple[Any, ...]:
        """The heartbeat details to send now (the same ``marks`` object every time)."""
        started: tuple[Any, ...] = (BODY_STARTED,) if self.body_started else ()
        return (*started, self.marks) if self.marks else started


_current: contextvars.ContextVar[AttemptDetails | None] = contextvars.ContextVar(
    "tooltrail_attempt_details", default=None
)


def current_details() -> AttemptDetails | None:
    """The running tool attempt's details, or ``None`` outside one."""
    return _current.get()


@contextlib.contextmanager
def attempt_details(details: AttemptDetails) -> Iterator[AttemptDetails]:
    """Make ``details`` the running attempt's, for every task started in the block."""
    token = _current.set(details)
    try:
        yield details
    finally:
        _current.reset(token)


def beat() -> None:
    """Heartbeat with the running attempt's details (``BODY_STARTED`` alone outside one).

    A no-op outside an activity and in a local activity (it has no heartbeats: its worker is
    the workflow's, and its timeout bounds it).
    """
    try:
        info = activity.info()
    except RuntimeError:
        return
    if info.is_local:
        return
    details = _current.get()
    activity.heartbeat(*(details.details() if details is not None else (BODY_STARTED,)))
