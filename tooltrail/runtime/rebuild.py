"""Rebuild a turn's trail from Temporal's history, for a turn that closed with no row at all.

A turn's records wait in its workflow until the first batch is written (``audit_interval_s``);
a workflow that Temporal ends before that (``temporal workflow terminate``, an execution
timeout, a worker lost for good during the first call) runs no more code, so the audit
database never hears of it. Its history still says everything that happened: the calls
(the workflow's input), each tool attempt scheduled and how it ended, and how the run
closed. Reconciliation (``tooltrail.runtime.reconciler``) turns that into the trail the turn
would have written, every record marked ``"rebuilt": true`` in its payload, so ``verify``
checks it like any other and ``tooltrail audit show`` says which records are rebuilt.

What a history cannot give back is left out, not made up: the worker-side parts of a
record (hook decisions an attempt's activity took, memory notes, the session's state) and
the attempts of ``@tool(local=True)`` tools (a local activity's input never enters the
history). An attempt still running when the run closed has its ``tool_pre`` and is listed
in the ``turn_reconciled`` record (``unfinished_attempts``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from tooltrail.core.envelopes import open_outcome
from tooltrail.core.results import ToolDispatchResult
from tooltrail.core.text import BREAKER_OPEN, render_text, stable_hash
from tooltrail.core.wire import (
    ATTEMPT_OUTCOME,
    TOOL_EXECUTE,
    TOOL_ON_PEER,
    AuditEvent,
    BreakerRefused,
    ExecuteAttempt,
    Flush,
    HookRefused,
    HooksPassed,
    InfraFailed,
    MemoHit,
    Ran,
    ShadowServed,
    TurnInput,
    TurnRecord,
)
from tooltrail.pipeline.middleware import RedactingMiddleware
from tooltrail.pipeline.redaction import redact_flush

__all__ = ["REBUILT", "RebuiltTurn", "close_detail", "rebuild_turn"]

REBUILT = "rebuilt"
"""The payload key (``True``) of every record reconciliation rebuilt from a history."""

_CLOSE_STATUS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
}
_ERROR_TYPES = {
    "failed": "WorkflowFailed",
    "cancelled": "WorkflowCancelled",
    "terminated": "WorkflowTerminated",
    "timed_out": "WorkflowTimedOut",
}
_ACTIVITY_ENDS = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "cancelled",
}
_EVENT_INPUT_LIMIT = 64 * 1024
"""Bytes of a call's input kept in its ``tool_call_received`` record (the workflow's rule)."""


class RebuiltTurn(BaseModel):
    """A turn's row and records as its history tells them, ready to be written."""

    turn: TurnRecord
    events: list[AuditEvent] = Field(default_factory=list)
    detail: str = ""
    """Temporal's words about how the run closed (the termination reason, ...)."""


def _at(event: HistoryEvent) -> datetime:
    return event.event_time.ToDatetime(tzinfo=UTC)


class _Builder:
    """Numbers the records of one rebuilt run, as the workflow numbers its own."""

    def __init__(self, turn_id: str, run_id: str) -> None:
        self.turn_id = turn_id
        self.run_id = run_id
        self.events: list[AuditEvent] = []

    def emit(
        self,
        kind: str,
        payload: dict[str, Any],
        at: datetime,
        *,
        request: ExecuteAttempt | None = None,
        call_id: str | None = None,
        tool: str | None = None,
        temporal_attempt: int | None = None,
        worker: str | None = None,
    ) -> None:
        self.events.append(
            AuditEvent(
                seq=len(self.events),
                kind=kind,
                tool_call_id=request.tool_call_id if request is not None else call_id,
                tool_name=request.tool_name if request is not None else tool,
                attempt=request.attempt if request is not None else None,
                payload={**payload, REBUILT: True},
                created_at=at,
                run_id=self.run_id,
                temporal_attempt=temporal_attempt,
                worker=worker,
            )
        )


def _received_input(arguments: dict[str, Any] | str) -> tuple[Any, int | None]:
    """A call's input as its ``tool_call_received`` record keeps it, and its size if cut."""
    try:
        size = len(json.dumps(arguments, ensure_ascii=False).encode("utf-8"))
    except (ValueError, RecursionError, TypeError):
        return "<not encodable as JSON: kept in the turn's workflow input>", None
    if size > _EVENT_INPUT_LIMIT:
        return f"<{size} bytes: kept in the turn's workflow input>", size
    return arguments, None


def _post_payload(
    turn_id: str, request: ExecuteAttempt, result: ToolDispatchResult, ran: Ran | None
) -> dict[str, Any]:
    """A ``tool_post`` record's payload, as the workflow writes it for the same outcome."""
    stored = ran is not None and ran.output_ref is not None
    payload: dict[str, Any] = {
        "turn": turn_id,
        "tool_call_id": request.tool_call_id,
        "tool": request.tool_name,
        "result_hash": (
            ran.output_hash
            if ran is not None and stored
            else stable_hash(render_text(result.output))
        ),
        "is_error": result.is_error,
        "duration": result.duration_ms,
        "display_hint": result.display_hint,
        "resolved_tool_name": result.resolved_tool_name,
        "input": request.arguments,
        "output": result.model_dump(mode="json")["output"],
        "started_at": ran.started_at.isoformat() if ran and ran.started_at else None,
        "finished_at": ran.finished_at.isoformat() if ran and ran.finished_at else None,
    }
    if ran is not None:
        if ran.output_ref is not None:
            payload["output_ref"] = ran.output_ref
        if ran.memo_served:
            payload["cached"] = True
        if ran.dispatch is not None:
            payload["dispatch"] = ran.dispatch
        if ran.post_hook_errors:
            payload["post_hook_errors"] = ran.post_hook_errors
        if ran.lost_attempts:
            payload["lost_attempts"] = ran.lost_attempts
    return payload


def _result(
    request: ExecuteAttempt, outcome: Ran | ShadowServed | InfraFailed
) -> ToolDispatchResult:
    return ToolDispatchResult(
        tool_call_id=request.tool_call_id,
        output=outcome.output,
        is_error=outcome.is_error,
        duration_ms=outcome.duration_ms,
        resolved_tool_name=outcome.resolved_tool_name or request.tool_name,
        display_hint=outcome.display_hint,
        output_ref=outcome.output_ref if isinstance(outcome, Ran) else None,
    )


class _Attempts:
    """The tool activities of a history, turned into ``tool_pre``/``tool_post`` records."""

    def __init__(self, client: Client, build: _Builder) -> None:
        self.client = client
        self.build = build
        self.scheduled: dict[int, ExecuteAttempt] = {}
        self.started: dict[int, tuple[int, str]] = {}
        """By scheduled event id: Temporal's attempt and the worker's identity."""

    async def scheduled_event(self, event: HistoryEvent) -> None:
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name != TOOL_EXECUTE:
            return
        [request] = await self.client.data_converter.decode_wrapper(attrs.input, [ExecuteAttempt])
        self.scheduled[event.event_id] = request
        if request.hooks_only:
            return  # the pre-tool hooks asked first: the attempt itself comes after
        self.build.emit(
            "tool_pre",
            {
                "turn": self.build.turn_id,
                "tool": request.tool_name,
                "tool_call_id": request.tool_call_id,
                "task_queue": attrs.task_queue.name,
            },
            _at(event),
            request=request,
        )

    def started_event(self, event: HistoryEvent) -> None:
        attrs = event.activity_task_started_event_attributes
        self.started[attrs.scheduled_event_id] = (attrs.attempt, attrs.identity)

    async def completed_event(self, event: HistoryEvent) -> None:
        done = event.activity_task_completed_event_attributes
        request = self.scheduled.pop(done.scheduled_event_id, None)
        if request is None:
            return
        [outcome] = await self.client.data_converter.decode_wrapper(done.result, [ATTEMPT_OUTCOME])
        outcome = open_outcome(outcome, request)
        at = _at(event)
        turn_id = self.build.turn_id
        match outcome:
            case Ran() | ShadowServed():
                ran = outcome if isinstance(outcome, Ran) else None
                self.build.emit(
                    "tool_post",
                    _post_payload(turn_id, request, _result(request, outcome), ran),
                    at,
                    request=request,
                    temporal_attempt=ran.temporal_attempt if ran is not None else None,
                    worker=(ran.worker or None) if ran is not None else None,
                )
            case BreakerRefused():
                self.build.emit("breaker_refused", {"tool": request.tool_name}, at, request=request)
                refusal = ToolDispatchResult(
                    tool_call_id=request.tool_call_id,
                    output=BREAKER_OPEN,
                    is_error=True,
                    duration_ms=0.0,
                    resolved_tool_name=request.tool_name,
                )
                self.build.emit(
                    "tool_post", _post_payload(turn_id, request, refusal, None), at, request=request
                )
            case HookRefused(hook=hook):
                self.build.emit(
                    "hook_decision",
                    {"tool": request.tool_name, "decision": hook.model_dump(mode="json")},
                    at,
                    request=request,
                )
            case HooksPassed() | MemoHit() | InfraFailed():
                pass  # nothing ran (or an outcome only a workflow makes): no record of its own

    async def ended_event(self, event: HistoryEvent) -> None:
        """An attempt whose activity failed, timed out or was cancelled (after its retries)."""
        how = _ACTIVITY_ENDS[event.event_type]
        failure: Failure | None = None
        if how == "failed":
            attrs: Any = event.activity_task_failed_event_attributes
            failure = attrs.failure
        elif how == "timed_out":
            attrs = event.activity_task_timed_out_event_attributes
            failure = attrs.failure
        else:
            attrs = event.activity_task_canceled_event_attributes
        request = self.scheduled.pop(attrs.scheduled_event_id, None)
        if request is None:
            return
        at = _at(event)
        text = f"the tool activity was {how.replace('_', ' ')}"
        if failure is not None:
            error = await self.client.data_converter.decode_failure(failure)
            cause = error.__cause__ if isinstance(error.__cause__, ApplicationError) else error
            if isinstance(cause, ApplicationError) and cause.type == TOOL_ON_PEER:
                # Not a failure: the worker sent the attempt to a peer that has the tool.
                queue = cause.details[0] if cause.details else None
                self.build.emit("tool_routed", {"task_queue": queue}, at, request=request)
                return
            text = f"{text}: {error}"
        started = self.started.get(attrs.scheduled_event_id)
        outcome = InfraFailed(output=text, is_error=True, resolved_tool_name=request.tool_name)
        payload = _post_payload(self.build.turn_id, request, _result(request, outcome), None)
        payload["activity_outcome"] = how
        self.build.emit(
            "tool_post",
            payload,
            at,
            request=request,
            temporal_attempt=started[0] if started else None,
            worker=started[1] if started else None,
        )

    def unfinished(self) -> list[dict[str, Any]]:
        """Attempts scheduled and still running when the run closed."""
        return [
            {
                "tool_call_id": request.tool_call_id,
                "tool": request.tool_name,
                "attempt": request.attempt,
                "started": event_id in self.started,
            }
            for event_id, request in sorted(self.scheduled.items())
            if not request.hooks_only
        ]


async def close_detail(client: Client, event: HistoryEvent, status: str) -> str:
    """Temporal's words about how a run closed, from its close event (``status`` otherwise)."""
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
        attrs = event.workflow_execution_terminated_event_attributes
        by = f" by {attrs.identity}" if attrs.identity else ""
        return f"terminated{by}: {attrs.reason or 'no reason given'}"
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
        return "the workflow's execution timeout passed"
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        failure = event.workflow_execution_failed_event_attributes.failure
        try:
            # With the codec on the message is encrypted: the client's converter has the keys.
            return f"failed: {await client.data_converter.decode_failure(failure)}"
        except Exception:  # a detail only; the status is what matters
            return f"failed: {failure.message}"
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
        return "cancelled"
    return status


async def rebuild_turn(
    client: Client,
    turn_id: str,
    run_id: str,
    history: Sequence[HistoryEvent],
    *,
    by: str,
    redactors: Sequence[RedactingMiddleware] = (),
) -> RebuiltTurn | None:
    """The row and records of a closed turn, from its run's history; ``None`` while it runs.

    Payloads are decoded with the client's data converter (its codec included). Stored texts
    are redacted with the host's ``RedactingMiddleware`` rules, as a worker's writes are.

    Args:
        client: the Temporal client (with the deployment's data converter).
        turn_id: the turn (its workflow id).
        run_id: the run the history is of.
        history: the run's history events.
        by: who rebuilt it, recorded in the ``turn_reconciled`` record.
        redactors: the host's redacting layers.

    Raises:
        ValueError: the history is not a ``TurnWorkflow``'s.
        Exception: a payload cannot be decoded (the codec's keys missing, say).
    """
    events = list(history)
    first = events[0] if events else None
    if first is None or first.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        raise ValueError(f"the history of {turn_id!r} does not start with the workflow's start")
    started = first.workflow_execution_started_event_attributes
    if started.workflow_type.name != "TurnWorkflow":
        raise ValueError(f"{turn_id!r} is a {started.workflow_type.name} workflow, not a turn")
    closing = events[-1]
    status = _CLOSE_STATUS.get(closing.event_type)
    if status is None:
        return None
    (inp,) = await client.data_converter.decode(list(started.input.payloads), [TurnInput])
    build = _Builder(turn_id, run_id)
    began = _at(first)
    build.emit(
        "turn_started",
        {
            "session_id": inp.session_id,
            "calls": len(inp.calls),
            "model_phase": inp.model is not None,
            "advertised": inp.advertised,
            "config": inp.config.model_dump(mode="json"),
            "rerun_of": inp.rerun_of,
            "shadow_of": inp.shadow.of_turn if inp.shadow else None,
        },
        began,
    )
    for call in inp.calls:
        shown, size = _received_input(call.arguments)
        payload = {"turn": turn_id, "tool": call.name, "call_id": call.id, "input": shown}
        if size is not None:
            payload["input_bytes"] = size
        build.emit("tool_call_received", payload, began, call_id=call.id, tool=call.name)
    attempts = _Attempts(client, build)
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            await attempts.scheduled_event(event)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attempts.started_event(event)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            await attempts.completed_event(event)
        elif event.event_type in _ACTIVITY_ENDS:
            await attempts.ended_event(event)
    closed_at = _at(closing)
    detail = await close_detail(client, closing, status)
    build.emit(
        "turn_reconciled",
        {
            "temporal_status": status,
            "previous_status": None,
            "status": status,
            "run_id": run_id,
            "closed_at": closed_at.isoformat(),
            "detail": detail,
            "by": by,
            "unfinished_attempts": attempts.unfinished(),
        },
        closed_at,
    )
    turn = TurnRecord(
        turn_id=turn_id,
        session_id=inp.session_id,
        status=status,
        started_at=began,
        ended_at=closed_at,
        call_count=len(inp.calls),
        error=None if status == "completed" else detail,
        error_type=_ERROR_TYPES.get(status),
        rerun_of=inp.rerun_of,
        mode="shadow" if inp.shadow else ("rerun" if inp.rerun_of else "live"),
        run_id=run_id,
    )
    # Secrets the host redacts never land in the database, rebuilt or not.
    flush = redact_flush(
        Flush(turn_id=turn_id, session_id=inp.session_id, turn=turn, events=build.events),
        redactors,
    )
    return RebuiltTurn(turn=flush.turn or turn, events=flush.events, detail=detail)
