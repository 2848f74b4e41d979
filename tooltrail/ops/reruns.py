"""Re-running past turns: ``rerun`` (the tools run again) and ``shadow`` (they do not).

Both start a new turn with the recorded calls of a past turn, linked to it in the ``turn``
table, then compare the two audit trails call by call. A shadow replay serves every tool
result from the original audit trail, so it has no side effects: what it reports is where
today's code and host configuration decide differently (a call now blocked, refused, retried
or resolved differently), not whether the tools behave differently.

A shadow attempt is served only a *result* the original attempt had: an attempt the original
turn refused before the body (a hook's block or unanswered ask, an open breaker, a loop
stop) has none, so if today's code lets it through, the shadow cannot say what the tool
would answer. It answers ``not recorded: would run live`` and the report lists that as a
divergence of its own, next to the decision that changed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tooltrail.core.config import RunConfig
from tooltrail.core.detection import LoopDetector
from tooltrail.core.results import ToolCall, ToolDispatchResult
from tooltrail.core.text import NOT_RECORDED
from tooltrail.core.wire import AuditEvent, RecordedAttempt, TurnRecord
from tooltrail.db.store import AuditStore
from tooltrail.errors import ConfigurationError

__all__ = [
    "NOT_RECORDED",
    "CallTrace",
    "Divergence",
    "RecordedTurn",
    "RerunReport",
    "calls_that_would_run",
    "compare",
    "load_turn",
]


class CallTrace(BaseModel):
    """What happened to one call, as its events tell it."""

    tool_call_id: str
    tool: str
    attempts: int = 0
    """Executed or refused attempts (``tool_pre`` events)."""
    decisions: list[str] = Field(default_factory=list)
    """Hook decisions, breaker refusals and loop stops, in order."""
    resolved_tool_name: str | None = None
    output: Any = None
    is_error: bool | None = None


class RecordedTurn(BaseModel):
    """A past turn, read back from the audit trail."""

    turn: TurnRecord
    calls: list[ToolCall]
    advertised: list[str]
    config: RunConfig
    detector: LoopDetector | None = None
    results: list[ToolDispatchResult] = Field(default_factory=list)
    """What the model got back (empty when the turn ended in a hard error)."""
    traces: dict[str, CallTrace] = Field(default_factory=dict)
    attempts: dict[str, RecordedAttempt] = Field(default_factory=dict)
    """Every attempt's result, by ``{tool_call_id}#{attempt}``."""
    cut_inputs: list[str] = Field(default_factory=list)
    """Calls whose arguments the trail holds only as a note (too large, or not JSON): their
    ``calls`` entry is that note; the arguments are in the turn's workflow input."""


class Divergence(BaseModel):
    """One difference between the original turn and its re-run."""

    tool_call_id: str | None
    """``None`` for the turn as a whole."""
    aspect: str
    original: Any
    now: Any


class RerunReport(BaseModel):
    """The outcome of a rerun or shadow replay."""

    original_turn_id: str
    new_turn_id: str
    mode: Literal["rerun", "shadow"]
    divergences: list[Divergence]

    @property
    def same(self) -> bool:
        """True when nothing diverged."""
        return not self.divergences


def _output(payload: dict[str, Any], blobs: dict[str, Any]) -> Any:
    """A ``tool_post``'s output; a large one was stored apart (its payload has the key)."""
    ref = payload.get("output_ref")
    if ref and ref in blobs:
        return blobs[ref]
    return payload.get("output")


def _trace(events: list[AuditEvent], blobs: dict[str, Any]) -> dict[str, CallTrace]:
    traces: dict[str, CallTrace] = {}
    for event in events:
        call_id = event.tool_call_id
        if call_id is None:
            continue
        trace = traces.setdefault(
            call_id, CallTrace(tool_call_id=call_id, tool=event.tool_name or "")
        )
        payload = event.payload
        if event.kind == "tool_pre":
            trace.attempts += 1
        elif event.kind == "hook_decision":
            outcome = payload.get("outcome")
            trace.decisions.append(
                f"hook {payload.get('decision')}" + (f" ({outcome})" if outcome else "")
            )
        elif event.kind == "breaker_refused":
            trace.decisions.append("breaker refused")
        elif event.kind == "loop_detected" and payload.get("stop"):
            trace.decisions.append("loop stop")
        elif event.kind == "tool_post":
            trace.resolved_tool_name = payload.get("resolved_tool_name")
            trace.output = _output(payload, blobs)
            trace.is_error = payload.get("is_error")
    return traces


def _refused(event: AuditEvent) -> bool:
    """Whether the event refuses its attempt before the body (no tool result follows)."""
    if event.kind == "hook_decision":
        return event.payload.get("outcome") != "approved"
    if event.kind == "loop_detected":
        return bool(event.payload.get("stop"))
    return event.kind == "breaker_refused"


def _attempts(events: list[AuditEvent], blobs: dict[str, Any]) -> dict[str, RecordedAttempt]:
    """Every attempt's *result*; a refusal's text is the layer's answer, not the tool's."""
    recorded = {}
    refused = {
        f"{event.tool_call_id}#{event.attempt or 0}"
        for event in events
        if event.tool_call_id is not None and _refused(event)
    }
    for event in events:
        if event.kind != "tool_post" or event.tool_call_id is None:
            continue
        if f"{event.tool_call_id}#{event.attempt or 0}" in refused:
            continue
        payload = event.payload
        recorded[f"{event.tool_call_id}#{event.attempt or 0}"] = RecordedAttempt(
            output=_output(payload, blobs) or "",
            is_error=bool(payload.get("is_error")),
            duration_ms=float(payload.get("duration") or 0.0),
            resolved_tool_name=payload.get("resolved_tool_name") or event.tool_name or "",
            display_hint=payload.get("display_hint"),
        )
    return recorded


async def load_turn(store: AuditStore, turn_id: str) -> RecordedTurn:
    """Read a turn back from the audit trail.

    Raises:
        ConfigurationError: the audit trail has no such turn.
    """
    turn = await store.turn(turn_id)
    events = await store.events(turn_id)
    if turn is None or not events or events[0].kind != "turn_started":
        raise ConfigurationError(f"the audit trail has no turn {turn_id!r}")
    started = events[0].payload
    calls = [
        ToolCall(e.tool_call_id or "", e.tool_name or "", e.payload.get("input", {}))
        for e in events
        if e.kind == "tool_call_received"
    ]
    end = next((e for e in reversed(events) if e.kind == "turn_end"), None)
    recorded_results: list[Any] = (end.payload.get("results") or []) if end else []
    results = [ToolDispatchResult.model_validate(r) for r in recorded_results]
    detector = started.get("detector")
    refs = sorted(
        {
            e.payload["output_ref"]
            for e in events
            if e.kind == "tool_post" and e.payload.get("output_ref")
        }
    )
    blobs = await store.blobs(refs) if refs else {}
    return RecordedTurn(
        turn=turn,
        calls=calls,
        advertised=list(started.get("advertised", [])),
        config=RunConfig.model_validate(started.get("config", {})),
        detector=None if detector is None else LoopDetector.model_validate(detector),
        results=results,
        traces=_trace(events, blobs),
        attempts=_attempts(events, blobs),
        cut_inputs=[
            e.tool_call_id or ""
            for e in events
            if e.kind == "tool_call_received" and "input_bytes" in e.payload
        ],
    )


def calls_that_would_run(original: RecordedTurn) -> list[ToolCall]:
    """The calls of a past turn that a live rerun dispatches (those of advertised tools)."""
    advertised = set(original.advertised)
    return [call for call in original.calls if call.name in advertised]


def compare(original: RecordedTurn, new: RecordedTurn) -> list[Divergence]:
    """List where the new turn differs from the original: the turn, then call by call.

    A shadow call that had no recorded result to serve is one ``shadow`` divergence (its
    output, error flag and resolved tool say nothing about the tool).
    """
    found: list[Divergence] = []
    for aspect in ("status", "error_type"):
        before, after = getattr(original.turn, aspect), getattr(new.turn, aspect)
        if before != after:
            found.append(Divergence(tool_call_id=None, aspect=aspect, original=before, now=after))
    for call in original.calls:
        before_trace = original.traces.get(call.id)
        after_trace = new.traces.get(call.id)
        if before_trace is None and after_trace is None:
            continue
        aspects = ["attempts", "decisions", "resolved_tool_name", "output", "is_error"]
        if after_trace is not None and after_trace.output == NOT_RECORDED:
            found.append(
                Divergence(
                    tool_call_id=call.id,
                    aspect="shadow",
                    original=before_trace.output if before_trace else None,
                    now=NOT_RECORDED,
                )
            )
            aspects = ["attempts", "decisions"]
        for aspect in aspects:
            before = getattr(before_trace, aspect) if before_trace else None
            after = getattr(after_trace, aspect) if after_trace else None
            if before != after:
                found.append(
                    Divergence(tool_call_id=call.id, aspect=aspect, original=before, now=after)
                )
    return found
