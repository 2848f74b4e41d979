"""What the host's ``RedactingMiddleware`` rules remove from every store of the audit database.

The middleware redacts what the model reads; these helpers apply the same rules to what the
worker stores: the audit events (the call's input included), memory, the turn's error (a loop
stop names the call's arguments), the session's state (the loop window keeps the calls'
params, the memo cache their outputs) and the stored copy of a large output or raw value.
Redaction is idempotent (markers are never matched again), so applying it twice is safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tooltrail.core.detection import LoopDetector
from tooltrail.core.wire import Flush, SessionState
from tooltrail.pipeline.middleware import RedactingMiddleware

__all__ = ["redact_flush", "redact_session", "redact_value"]


def redact_value(value: Any, redactors: Sequence[RedactingMiddleware]) -> Any:
    """Redact every string inside JSON-like data with each redactor in turn."""
    for redactor in redactors:
        value = redactor.redact_value(value)
    return value


def _text(text: str, redactors: Sequence[RedactingMiddleware]) -> str:
    for redactor in redactors:
        text = redactor.redact_text(text)
    return text


def redact_session(state: SessionState, redactors: Sequence[RedactingMiddleware]) -> SessionState:
    """The session's state as it may be stored.

    A loop-window param that held a secret is stored redacted: a later turn's identical call
    no longer counts as the same operation (a documented limit: with a secret in its params,
    a loop across turns is seen afresh in each turn; within a turn nothing changes).
    """
    detector = state.detector.model_dump(mode="json")
    for name in ("window", "warned"):
        for op in detector[name]:
            op["param"] = _text(op["param"], redactors)
    memo = state.memo.model_copy(
        update={
            "entries": [
                entry.model_copy(update={"output": _output(entry.output, redactors)})
                for entry in state.memo.entries
            ]
        }
    )
    return state.model_copy(
        update={"detector": LoopDetector.model_validate(detector), "memo": memo}
    )


def _output(output: Any, redactors: Sequence[RedactingMiddleware]) -> Any:
    for redactor in redactors:
        output = redactor.redact_output(output)
    return output


def redact_flush(flush: Flush, redactors: Sequence[RedactingMiddleware]) -> Flush:
    """A flush with every stored text redacted: events, memory, turn error, session state."""
    if not redactors:
        return flush
    events = [
        event.model_copy(update={"payload": redact_value(event.payload, redactors)})
        for event in flush.events
    ]
    memory = [
        entry.model_copy(update={"content": _text(entry.content, redactors)})
        for entry in flush.memory
    ]
    update: dict[str, Any] = {"events": events, "memory": memory}
    if flush.turn is not None and flush.turn.error:
        update["turn"] = flush.turn.model_copy(update={"error": _text(flush.turn.error, redactors)})
    if flush.session is not None:
        update["session"] = redact_session(flush.session, redactors)
    return flush.model_copy(update=update)
