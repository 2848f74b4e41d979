"""Observers (spec §8): the turn's event stream, delivered worker-side to host objects.

Events reach observers in ``seq`` order, at least once: a record that is sent again (after a
failed audit write or a lost worker) is delivered again, so every event carries a stable
``event_id`` (turn id and ``seq``) for de-duplication. An observer that raises or hangs is
logged and skipped; the others still run, and the turn never notices.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from tooltrail.core.wire import AuditEvent

__all__ = ["OBSERVER_METHODS", "ObservedEvent", "deliver"]

log = logging.getLogger("tooltrail.observers")

OBSERVER_METHODS = {
    "tool_call_received": "on_tool_call_received",
    "tool_pre": "on_tool_pre",
    "tool_post": "on_tool_post",
    "loop_detected": "on_loop_detected",
    "turn_end": "on_turn_end",
}
"""Which observer method receives which event kind; every event also goes to ``on_event``."""


class ObservedEvent(BaseModel):
    """An event as an observer receives it."""

    event_id: str
    """``{turn_id}:{seq}``: stable across re-deliveries."""
    turn_id: str
    session_id: str
    seq: int
    kind: str
    tool_call_id: str | None = None
    tool_name: str | None = None
    attempt: int | None = None
    payload: dict[str, Any]
    created_at: datetime


async def deliver(
    observers: Sequence[object],
    *,
    turn_id: str,
    session_id: str,
    events: Sequence[AuditEvent],
    timeout_s: float = 5.0,
) -> int:
    """Deliver events in ``seq`` order to every observer; return the failures (logged)."""
    failures = 0
    for event in sorted(events, key=lambda e: e.seq):
        observed = ObservedEvent(
            event_id=f"{turn_id}:{event.seq}",
            turn_id=turn_id,
            session_id=session_id,
            **event.model_dump(),
        )
        names = [OBSERVER_METHODS.get(event.kind), "on_event"]
        for observer in observers:
            for name in names:
                method = getattr(observer, name, None) if name else None
                if method is None:
                    continue
                try:
                    result = method(observed)
                    if inspect.isawaitable(result):
                        await asyncio.wait_for(result, timeout_s)
                except Exception:
                    failures += 1
                    log.warning(
                        "observer %s.%s failed on %s",
                        type(observer).__name__,
                        name,
                        observed.event_id,
                        exc_info=True,
                    )
    return failures
