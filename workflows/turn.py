"""``TurnWorkflow``: one model turn's tool calls through the dispatch pipeline.

Deterministic code only: control (ordering, attempt counting, recovery decisions, the event
stream) lives here; every tool body, reflector, database write and piece of user code runs
in an activity. The event stream is numbered here (``seq``) so the audit trail's order is
fixed by the history. The records are written in batches by a local activity (see
``RunConfig.audit_interval_s``), so they never enter the history and cost no round trip of
their own; turns recorded before that (no ``audit-batches`` patch marker) sent them with the
next activity instead, and still replay that way.

Hard errors (``LoopDetected``, ``ToolRecoveryExhausted``) leave as non-retryable
``ApplicationError``s; cancellation leaves as ``asyncio.CancelledError`` so the workflow ends
*cancelled*. Either way the audit trail is written first.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from tooltrail.detection import LoopCheck, operation_for
from tooltrail.errors import LoopDetected, ToolRecoveryExhausted, TurnError, TurnFailed
from tooltrail.hooks import HookDecision, headless_ask_text
from tooltrail.llm.errors import MODEL_RETRY_POLICY
from tooltrail.llm.messages import Message, ModelResponse, Usage
from tooltrail.memoize import with_cached_marker
from tooltrail.planner import CallVerdict, plan_waves
from tooltrail.recovery import (
    MAX_RECOVERY_ATTEMPTS,
    Action,
    Analysis,
    Fail,
    InputFix,
    Retry,
    ToolChange,
)
from tooltrail.results import ToolCall, ToolDispatchResult
from tooltrail.text import (
    MAX_ARGUMENT_DEPTH,
    canonical_json,
    duplicate_call_id,
    invalid_arguments,
    nesting_exceeds,
    not_available,
    render_text,
    stable_hash,
    trajectory,
)
from tooltrail.wire import (
    AUDIT_RECORD,
    MODEL_TURN,
    RECOVERY_REFLECT,
    TOOL_EXECUTE,
    ApprovalInput,
    AttemptOutcome,
    AuditEvent,
    ConversationAppend,
    ExecuteAttempt,
    Flush,
    MemoryEntry,
    ModelPhase,
    ModelTurnOutcome,
    ModelTurnRequest,
    PendingApproval,
    RecordTurn,
    ReflectInput,
    ReflectOutcome,
    SessionState,
    TurnInput,
    TurnOutput,
    TurnRecord,
    TurnStatus,
    unpack_dispatch,
)

__all__ = ["TurnWorkflow"]

# Audit writes must not be lost: retry them long, with a ceiling so a permanently broken
# database ends in a visible workflow failure rather than a silent spin.
_RECORD_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=40,
)
# Histories recorded before audit records were written in batches by local activities
# carry them in every tool activity's input instead (and end with a regular activity).
_PATCH_AUDIT_BATCHES = "audit-batches"
# A local activity's failure reaches the workflow as the activity's own ApplicationError, not
# wrapped in an ActivityError as a regular activity's is (its timeouts are wrapped either
# way). Turns recorded before this was known failed on such an error instead of handling it.
_PATCH_LOCAL_FAILURES = "local-activity-failures"
# An activity cut short by the turn's cancellation resolves as a failed activity; where that
# failure was an answer (the model call failed, the reflector was unavailable, an audit batch
# was not written), turns recorded before this was handled went on with it instead of ending
# cancelled.
_PATCH_CANCELLED_ACTIVITY = "cancelled-activity"
_BATCH_EVENTS = 200
"""Pending events that make the next tool call write a batch, however recent the last."""
# The longest one model call may take, as an activity or a local one.
_MODEL_TIMEOUT = timedelta(minutes=10)
# A reflector may call a model: give it time, and retry infrastructure failures a little.
_REFLECT_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=3)
# Margin on top of a tool's own timeout, so the tool's soft timeout text wins over Temporal's.
_TIMEOUT_MARGIN = timedelta(seconds=30)


def _parse_arguments(arguments: dict[str, Any] | str) -> dict[str, Any] | str:
    """Return the arguments as a dict, or the soft error text when raw JSON is unusable."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return invalid_arguments(f"not valid JSON ({exc.msg} at position {exc.pos})")
    except (ValueError, RecursionError) as exc:
        # Valid-looking JSON Python cannot take (a 5,000-digit number, extreme nesting).
        return invalid_arguments(f"not valid JSON ({type(exc).__name__}: {exc})"[:300])
    if not isinstance(parsed, dict):
        return invalid_arguments(f"expected a JSON object, got {type(parsed).__name__}")
    return parsed


def _argument_problem(arguments: dict[str, Any], max_bytes: int) -> str | None:
    """Why the arguments cannot be dispatched, or ``None``."""
    if nesting_exceeds(arguments):
        return invalid_arguments(f"nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    try:
        size = _json_size(arguments)
    except UnicodeEncodeError:
        return invalid_arguments("contains text that is not valid Unicode (a lone surrogate)")
    except (ValueError, RecursionError, TypeError) as exc:
        return invalid_arguments(f"cannot be encoded as JSON ({type(exc).__name__})")
    if size > max_bytes:
        return invalid_arguments(f"{size} bytes of arguments; at most {max_bytes} are accepted")
    return None


def _handles(failure: ActivityError | ApplicationError) -> bool:
    """Whether the turn handles this activity failure (see ``_PATCH_LOCAL_FAILURES``)."""
    return isinstance(failure, ActivityError) or workflow.patched(_PATCH_LOCAL_FAILURES)


def _pre_answered(call: ToolCall, text: str) -> ToolDispatchResult:
    return ToolDispatchResult(
        tool_call_id=call.id,
        output=text,
        is_error=True,
        duration_ms=0.0,
        resolved_tool_name=call.name,
    )


_FLUSH_BUDGET = 256 * 1024
"""Bytes of audit records one activity carries at most (the rest follow with later ones)."""
_EVENT_INPUT_LIMIT = 64 * 1024
"""Bytes of a call's input recorded in its tool_call_received event before it is cut."""


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))


def _safe_size(value: Any) -> int | None:
    if not isinstance(value, str) and nesting_exceeds(value):
        return None
    try:
        return _json_size(value)
    except (ValueError, RecursionError, TypeError):  # UnicodeEncodeError is a ValueError
        return None


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _cancelling() -> bool:
    # Temporal delivers workflow cancellation by cancelling the run task.
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _raise_if_cancelled_activity() -> None:
    # Called where an activity failed: if the turn's cancellation cut it short, the turn
    # ends cancelled instead of taking the failure for an answer (_PATCH_CANCELLED_ACTIVITY).
    if _cancelling() and workflow.patched(_PATCH_CANCELLED_ACTIVITY):
        raise asyncio.CancelledError()


def _raise_if_cancelled() -> None:
    # When a result and the cancellation arrive together, the pending request must win
    # (spec §9.5).
    if _cancelling():
        raise asyncio.CancelledError()


def _correct(
    correction: InputFix | ToolChange | None, tool: str, arguments: dict[str, Any]
) -> tuple[str, dict[str, Any], str | None]:
    """Apply a correction; return the new tool, input and the failure text (if unusable)."""
    match correction:
        case None:
            return tool, arguments, None
        case InputFix(modified_input=None):
            return tool, arguments, "InputFix correction missing modified_input"
        case InputFix(modified_input=dict() as fixed):
            return tool, fixed, None
        case InputFix():
            return tool, arguments, "InputFix correction modified_input must be a JSON object"
        case ToolChange(alternative_tool=str() as alternative) if alternative:
            return alternative, arguments, None
        case ToolChange():
            return tool, arguments, "ToolChange correction missing alternative_tool"


@workflow.defn(name="TurnWorkflow")
class TurnWorkflow:
    """Runs one turn's tool calls and returns one result per call, in the model's order."""

    @workflow.init
    def __init__(self, inp: TurnInput) -> None:
        """Set up the event stream for this execution."""
        self._input = inp
        self._turn = TurnRecord(
            turn_id=workflow.info().workflow_id,
            session_id=inp.session_id,
            started_at=workflow.now(),
            call_count=len(inp.calls),
            rerun_of=inp.rerun_of,
            mode="shadow" if inp.shadow else ("rerun" if inp.rerun_of else "live"),
        )
        self._next_seq = 0
        # Decided when the run starts (a patch); see _PATCH_AUDIT_BATCHES.
        self._batched = False
        self._last_write = self._turn.started_at
        self._turn_written: TurnRecord | None = None
        self._events: list[AuditEvent] = []
        self._memory: list[MemoryEntry] = []
        # Records handed to an activity that has not reported yet (memory entries as -1 - seq).
        self._in_flight: set[int] = set()
        self._finished: list[str] = []
        # Interactive approvals: calls parked on a hook's Ask, and the answers received.
        self._waiting: dict[str, PendingApproval] = {}
        self._answers: dict[str, ApprovalInput] = {}
        # An agent turn's tool results for its run's conversation (ModelPhase.state_in_db).
        self._conversation: ConversationAppend | None = None
        self._adopt_session(inp.session)

    def _adopt_session(self, state: SessionState) -> None:
        """Take up the session-scoped state the previous turn left (carried in, or read).

        A shadow replay starts from the state the original turn started with, and saves
        nothing.
        """
        start = state.detector
        if self._input.shadow is not None:
            start = self._input.shadow.detector or type(start)()
        self._detector = start.model_copy(deep=True)
        self._memo = state.memo.model_copy(deep=True)
        self._turn_number = state.version
        if self._input.memo is not None:
            self._memo.expire(self._input.memo, self._turn_number)

    # -- interactive approvals -----------------------------------------------------------

    @workflow.update(name="approval")
    async def approval(self, answer: ApprovalInput) -> None:
        """Approve or deny a call parked on a hook's ``Ask``."""
        self._answers[answer.tool_call_id] = answer

    @approval.validator
    def _validate_approval(self, answer: ApprovalInput) -> None:
        if answer.tool_call_id not in self._waiting:
            waiting = ", ".join(sorted(self._waiting)) or "none"
            raise ValueError(
                f"call {answer.tool_call_id!r} is not waiting for approval (waiting: {waiting})"
            )

    @workflow.query(name="pending_approvals")
    def pending_approvals(self) -> list[PendingApproval]:
        """The calls waiting for a human, in the order they asked."""
        return list(self._waiting.values())

    # -- the event stream ------------------------------------------------------------------

    def _emit(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        call_id: str | None = None,
        tool: str | None = None,
        attempt: int | None = None,
        at: datetime | None = None,
    ) -> AuditEvent:
        event = AuditEvent(
            seq=self._next_seq,
            kind=kind,
            tool_call_id=call_id,
            tool_name=tool,
            attempt=attempt,
            payload=payload,
            created_at=at or workflow.now(),
        )
        self._next_seq += 1
        self._events.append(event)
        return event

    def _flush(self) -> Flush:
        """Take the pending records, unless another activity is carrying some.

        One flush at a time keeps the writes, and so the observers' deliveries, in ``seq``
        order even when the calls of a wave run concurrently.
        """
        if self._in_flight:
            return Flush(turn_id=self._turn.turn_id, session_id=self._turn.session_id)
        # A byte budget keeps every activity input far below Temporal's payload limit; what
        # does not fit goes with the next activity (always at least one record).
        events: list[AuditEvent] = []
        budget = _FLUSH_BUDGET
        for event in self._events:
            budget -= _json_size(event.payload)
            if events and budget < 0:
                break
            events.append(event)
        flush = Flush(
            turn_id=self._turn.turn_id,
            session_id=self._turn.session_id,
            # The turn's row travels only when it changed since it was last written.
            turn=None if self._turn == self._turn_written else self._turn,
            events=events,
            memory=list(self._memory),
        )
        self._in_flight.update(e.seq for e in flush.events)
        self._in_flight.update(-1 - m.seq for m in flush.memory)
        return flush

    async def _records_for_activity(self) -> Flush | None:
        """Before an activity: write a batch when one is due, or take the records it carries.

        Turns recorded before the batches (see ``_PATCH_AUDIT_BATCHES``) send their records
        with the activity; the others get ``None``.
        """
        if self._batched:
            await self._checkpoint()
            return None
        return self._flush()

    def _flushed(self, flush: Flush | None, *, written: bool = True) -> None:
        """Drop written records; records whose write failed are sent again later."""
        if flush is None:
            return  # the activity carried no records
        events = {event.seq for event in flush.events}
        memory = {entry.seq for entry in flush.memory}
        self._in_flight.difference_update(events)
        self._in_flight.difference_update(-1 - seq for seq in memory)
        if written:
            if flush.turn is not None:
                self._turn_written = flush.turn
            self._events = [e for e in self._events if e.seq not in events]
            self._memory = [m for m in self._memory if m.seq not in memory]

    async def _record(self, status: TurnStatus, error: BaseException | None = None) -> None:
        self._turn = self._turn.model_copy(
            update={
                "status": status,
                "ended_at": workflow.now(),
                "error": None if error is None else (str(error) or type(error).__name__),
                "error_type": None if error is None else type(error).__name__,
            }
        )
        self._in_flight.clear()  # nothing else runs any more: send everything still pending
        detection = self._input.config.detection
        if self._input.ends_run and detection.enabled:
            self._detector.end_of_run(detection)
        if self._batched:
            await self._record_batches()
            return
        flush = self._flush().model_copy(update={"session": self._final_session()})
        try:
            await workflow.execute_activity(
                AUDIT_RECORD,
                RecordTurn(flush=flush),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=_RECORD_RETRY,
            )
        finally:
            self._in_flight.clear()
        self._flushed(flush)

    async def _record_batches(self) -> None:
        """Write everything still pending, the turn's final row and the session state last.

        Local activities: no server round trip of their own, and only their (empty) results
        enter the history, never the records. On replay the records are rebuilt from the
        history; the writes are idempotent (by turn id and seq), so a re-run is safe.
        """
        while True:
            flush = self._flush()
            last = len(flush.events) == len(self._events) and len(flush.memory) == len(self._memory)
            if last:
                flush = flush.model_copy(
                    update={"session": self._final_session(), "conversation": self._conversation}
                )
            else:
                # The final status waits for the last batch, so a turn marked ended in the
                # database has its whole trail; a first write still creates the row.
                running = None
                if self._turn_written is None:
                    running = self._turn.model_copy(
                        update={
                            "status": "running",
                            "ended_at": None,
                            "error": None,
                            "error_type": None,
                        }
                    )
                flush = flush.model_copy(update={"turn": running})
            try:
                await workflow.execute_local_activity(
                    AUDIT_RECORD,
                    RecordTurn(flush=flush),
                    result_type=bool,
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=_RECORD_RETRY,
                )
            finally:
                self._in_flight.clear()
            self._flushed(flush)
            if last:
                return

    async def _checkpoint(self, *, force: bool = False) -> None:
        """Write the pending records in one batch, when due (see ``audit_interval_s``).

        Best effort: with the database down the records stay pending for the next batch,
        and the turn goes on (the final write is the one that insists).
        """
        if not self._batched or self._in_flight or not (self._events or self._memory):
            return
        interval = timedelta(seconds=self._input.config.audit_interval_s)
        if not (
            force
            or len(self._events) >= _BATCH_EVENTS
            or workflow.now() - self._last_write >= interval
        ):
            return
        flush = self._flush()
        written = False
        try:
            written = await workflow.execute_local_activity(
                AUDIT_RECORD,
                RecordTurn(flush=flush, must_persist=False),
                result_type=bool,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except (ActivityError, ApplicationError) as failure:
            if not _handles(failure):
                raise
            # Cancelled while writing: a backoff timer or an approval wait must not follow.
            _raise_if_cancelled_activity()
            workflow.logger.warning("audit batch not written; it goes with the next one")
        finally:
            self._flushed(flush, written=written)
        self._last_write = workflow.now()

    def _turn_end(
        self,
        started: datetime,
        results: list[ToolDispatchResult],
        *,
        success: bool,
        error: str | None = None,
        usage: Usage | None = None,
        phase: str = "tools",
    ) -> None:
        # Two per model turn with tools (spec §8): the LLM phase, then the tool phase, with
        # durations that do not overlap and the same token counts (tools spend none).
        payload: dict[str, Any] = {
            "phase": phase,
            "success": success,
            "error": error,
            "duration_ms": (workflow.now() - started).total_seconds() * 1000.0,
            "results": [result.model_dump(mode="json") for result in results],
        }
        if usage is not None:
            payload.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        self._emit("turn_end", payload)

    # -- the turn ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutput:
        """Dispatch every call; soft errors are results, hard errors fail the workflow."""
        started = workflow.now()
        self._batched = workflow.patched(_PATCH_AUDIT_BATCHES)
        state_in_db = inp.model is not None and inp.model.state_in_db
        if not state_in_db:
            self._started(started)  # else once the model call has read the session's state
        results: list[ToolDispatchResult] = []
        response: ModelResponse | None = None
        tools_started = started
        try:
            if inp.model is not None:
                # The model phase: its tool calls are this turn's calls.
                response, verdicts = await self._model_phase(inp.model, started)
                # The worker judged the calls for parallel dispatch (histories recorded
                # before it did carry none: their turns ran the calls one by one). The
                # model phase may have read the session's state into self._input.
                inp = self._input.model_copy(
                    update={"calls": response.message.tool_calls, "verdicts": verdicts}
                )
                self._input = inp
                self._turn = self._turn.model_copy(update={"call_count": len(inp.calls)})
                tools_started = workflow.now()
            self._receive(inp.calls)
            results = await self._dispatch_batch(inp)
        except asyncio.CancelledError as cancelled:
            self._started(started)
            self._emit(
                "turn_cancelled",
                {
                    "finished_calls": list(self._finished),
                    "pending_calls": [c.id for c in inp.calls if c.id not in self._finished],
                },
            )
            self._turn_end(started, [], success=False, error="cancelled")
            await self._record("cancelled", cancelled)
            raise
        except TurnError as hard:
            self._started(started)
            # The batch's results are discarded; the audit trail keeps everything.
            self._turn_end(tools_started, [], success=False, error=str(hard))
            await self._record("failed", hard)
            raise self._application_error(hard) from None
        usage = response.usage if response is not None else None
        if response is None or inp.calls:
            self._turn_end(tools_started, results, success=True, usage=usage)
        if state_in_db and inp.model is not None and results:
            # The results go to the conversation with the final record, after the answer.
            self._conversation = ConversationAppend(
                run_id=inp.model.run_id,
                start_seq=inp.model.start_seq + len(inp.model.new_messages) + 1,
                messages=[
                    Message.from_result(result, name=call.name)
                    for call, result in zip(inp.calls, results, strict=True)
                ],
            )
        await self._finish_recording()
        return TurnOutput(
            turn_id=self._turn.turn_id,
            # An agent turn with its state in the database returns neither its results nor
            # the session's state: the next turn reads both, and the run's history stays flat.
            results=[] if state_in_db else results,
            assistant=response.message if response is not None else None,
            usage=usage,
            stop_reason=response.stop_reason if response is not None else None,
            # Only an agent run carries the state to its next turn; a plain turn's next one
            # loads what the final record saved (and the history need not hold it twice).
            session=self._final_session() if inp.model is not None and not state_in_db else None,
        )

    def _started(self, at: datetime) -> None:
        """Emit ``turn_started`` (the turn's first event), unless it was emitted already."""
        if self._next_seq > 0:
            return  # turn_started is always seq 0: nothing is emitted before it
        inp = self._input
        self._emit(
            "turn_started",
            {
                "session_id": inp.session_id,
                "calls": len(inp.calls),
                "model_phase": inp.model is not None,
                "advertised": inp.advertised,
                "config": inp.config.model_dump(mode="json"),
                # What a later shadow replay needs to start where this turn started.
                "detector": self._detector.model_dump(mode="json"),
                "rerun_of": inp.rerun_of,
                "shadow_of": inp.shadow.of_turn if inp.shadow else None,
            },
            at=at,
        )

    def _receive(self, calls: list[ToolCall]) -> None:
        # on_tool_call_received fires for every call, unknown ones included, before dispatch.
        for call in calls:
            payload: dict[str, Any] = {
                "turn": self._turn.turn_id,
                "tool": call.name,
                "call_id": call.id,
                "input": call.arguments,
            }
            size = _safe_size(call.arguments)
            if size is None or size > _EVENT_INPUT_LIMIT:
                # The full input is in the turn's workflow input (history); the event keeps
                # a note of it so no audit write can outgrow a payload.
                payload["input"] = (
                    "<not encodable as JSON: kept in the turn's workflow input>"
                    if size is None
                    else f"<{size} bytes: kept in the turn's workflow input>"
                )
                payload["input_bytes"] = size
            self._emit("tool_call_received", payload, call_id=call.id, tool=call.name)

    async def _model_phase(
        self, phase: ModelPhase, started: datetime
    ) -> tuple[ModelResponse, list[CallVerdict] | None]:
        """Ask the model (one activity, local with ``phase.local``; it keeps the conversation)."""
        flush = await self._records_for_activity()
        request = ModelTurnRequest(
            phase=phase,
            turn_id=self._turn.turn_id,
            flush=flush,
            verdicts=self._input.config.dispatch == "parallel",
            advertised=self._input.advertised if phase.catalog is None else None,
            session_id=self._input.session_id if phase.state_in_db else None,
        )
        try:
            if phase.local:
                # start_agent(local_model=True): the call runs in this workflow task, so the
                # turn saves the activity's server round trip and the workflow task after it.
                outcome: ModelTurnOutcome = await workflow.execute_local_activity(
                    MODEL_TURN,
                    request,
                    result_type=ModelTurnOutcome,
                    start_to_close_timeout=_MODEL_TIMEOUT,
                    retry_policy=MODEL_RETRY_POLICY,
                )
            else:
                outcome = await workflow.execute_activity(
                    MODEL_TURN,
                    request,
                    result_type=ModelTurnOutcome,
                    start_to_close_timeout=_MODEL_TIMEOUT,
                    heartbeat_timeout=timedelta(seconds=60),
                    retry_policy=MODEL_RETRY_POLICY,
                )
        except (ActivityError, ApplicationError) as failure:
            if not _handles(failure):
                raise
            self._flushed(flush, written=False)
            _raise_if_cancelled_activity()
            cause = failure.cause if isinstance(failure, ActivityError) else None
            raise TurnFailed(f"model call failed: {cause or failure}") from None
        self._flushed(flush, written=outcome.flushed)
        if phase.state_in_db:
            state = outcome.session or SessionState()
            self._input = self._input.model_copy(update={"session": state})
            self._adopt_session(state)
            self._started(started)  # the turn's first event, now that the detector is known
        response = outcome.response
        self._emit(
            "model_response",
            {
                "run_id": phase.run_id,
                "text": response.message.content,
                "tool_calls": [c.model_dump(mode="json") for c in response.message.tool_calls],
                "stop_reason": response.stop_reason,
                "usage": response.usage.model_dump(mode="json"),
                "reused": outcome.reused,
            },
        )
        self._turn_end(started, [], success=True, usage=response.usage, phase="llm")
        return response, outcome.verdicts

    def _final_session(self) -> SessionState | None:
        if self._input.shadow is not None:
            return None
        return SessionState(
            version=self._input.session.version + 1, detector=self._detector, memo=self._memo
        )

    async def _finish_recording(self) -> None:
        # Every call has its result: a cancellation arriving now cannot change the outcome,
        # so it must not cost the audit trail its final write.
        for _ in range(3):
            try:
                await self._record("completed")
                return
            except asyncio.CancelledError:
                workflow.logger.info("cancellation after the last result; completing the turn")
        await self._record("completed")

    @staticmethod
    def _application_error(hard: TurnError) -> ApplicationError:
        if isinstance(hard, ToolRecoveryExhausted):
            return ApplicationError(
                str(hard),
                hard.tool,
                hard.attempts,
                type="ToolRecoveryExhausted",
                non_retryable=True,
            )
        if isinstance(hard, LoopDetected):
            return ApplicationError(
                str(hard), hard.message, type="LoopDetected", non_retryable=True
            )
        return ApplicationError(str(hard), type=type(hard).__name__, non_retryable=True)

    async def _dispatch_batch(self, inp: TurnInput) -> list[ToolDispatchResult]:
        """Answer unknown and malformed calls, dispatch the batch, fill slots in call order."""
        advertised = set(inp.advertised)
        slots: list[ToolDispatchResult | None] = [None] * len(inp.calls)
        batch: list[tuple[int, ToolCall, dict[str, Any]]] = []
        seen: set[str] = set()
        for position, call in enumerate(inp.calls):
            if call.id in seen:
                # Results pair with calls by id: a second call with the same id could not be
                # told apart from the first, so only the first one runs.
                slots[position] = _pre_answered(call, duplicate_call_id(call.id))
                continue
            seen.add(call.id)
            if call.name not in advertised:
                # Never advertised: answered before dispatch, no events, no activity.
                slots[position] = _pre_answered(call, not_available(call.name))
                self._finished.append(call.id)
                continue
            arguments = _parse_arguments(call.arguments)
            if isinstance(arguments, str):
                slots[position] = _pre_answered(call, arguments)
                self._finished.append(call.id)
                continue
            problem = _argument_problem(arguments, inp.config.max_argument_bytes)
            if problem is not None:
                slots[position] = _pre_answered(call, problem)
                self._finished.append(call.id)
                continue
            batch.append((position, call, arguments))
        if inp.config.dispatch == "parallel" and len(batch) >= 2:
            await self._dispatch_waves(inp, batch, slots)
        else:
            # Sequential (spec §9.2): the first hard error aborts; later calls never start.
            for position, call, arguments in batch:
                _raise_if_cancelled()
                slots[position] = await self._dispatch(call, arguments)
                self._finished.append(call.id)
        return [
            slot
            if slot is not None
            else _pre_answered(inp.calls[position], "dispatch produced no result")
            for position, slot in enumerate(slots)
        ]

    async def _dispatch_waves(
        self,
        inp: TurnInput,
        batch: list[tuple[int, ToolCall, dict[str, Any]]],
        slots: list[ToolDispatchResult | None],
    ) -> None:
        """Parallel dispatch (spec §9.3): waves in order, calls of a wave concurrently."""
        verdicts = inp.verdicts or []
        plan = plan_waves(
            [
                verdicts[position] if position < len(verdicts) else CallVerdict()
                for position, _call, _arguments in batch
            ]
        )
        # One limit shared by every wave, bounded by the batch; granted first in, first out.
        permits = asyncio.Semaphore(max(1, min(inp.config.max_concurrency, len(batch))))

        async def run(call: ToolCall, arguments: dict[str, Any]) -> ToolDispatchResult:
            async with permits:
                result = await self._dispatch(call, arguments)
            self._finished.append(call.id)
            return result

        for wave in plan:
            _raise_if_cancelled()
            tasks = [asyncio.create_task(run(batch[i][1], batch[i][2])) for i in wave]
            try:
                await workflow.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            except asyncio.CancelledError:
                # The turn was cancelled: stop the wave's calls and let them settle first.
                await self._cancel_and_settle(tasks)
                raise
            if any(task.done() and not task.cancelled() and task.exception() for task in tasks):
                await self._cancel_and_settle(tasks)
                # The earliest hard error in wave order wins; siblings we cancelled don't count.
                for task in tasks:
                    error = None if task.cancelled() else task.exception()
                    if error is not None and not isinstance(error, asyncio.CancelledError):
                        raise error
            for index, task in zip(wave, tasks, strict=True):
                slots[batch[index][0]] = task.result()

    @staticmethod
    async def _cancel_and_settle(tasks: list[asyncio.Task[ToolDispatchResult]]) -> None:
        for task in tasks:
            if not task.done():
                task.cancel()
        await workflow.wait(tasks)

    async def _dispatch(self, call: ToolCall, arguments: dict[str, Any]) -> ToolDispatchResult:
        """Run the per-attempt pipeline (spec §2.1) for one call, retries included."""
        original_tool = call.name
        tool_name = call.name
        attempt = 0
        while True:
            # 1 PRE
            self._emit(
                "tool_pre",
                {"turn": self._turn.turn_id, "tool": tool_name, "tool_call_id": call.id},
                call_id=call.id,
                tool=tool_name,
                attempt=attempt,
            )
            outcome = await self._gated_attempt(call, tool_name, arguments, attempt)
            if isinstance(outcome, ToolDispatchResult):
                return outcome  # refused before execution: no POST phase, no recovery
            # The model-issued id is stamped here, whatever the layers below returned.
            result = ToolDispatchResult(
                tool_call_id=call.id,
                output=outcome.output,
                is_error=outcome.is_error,
                duration_ms=outcome.duration_ms,
                resolved_tool_name=outcome.resolved_tool_name or tool_name,
                display_hint=outcome.display_hint,
                output_ref=outcome.output_ref,
            )
            # 6 POST: a. record detection before observers hear of the result; b. on_tool_post
            # (6c post hooks ran in the activity, after the body; 6d health joins here)
            # A large output stayed in the database: its hash and first characters came back.
            text = (
                render_text(result.output)
                if outcome.output_ref is None
                else (outcome.output_preview or "")
            )
            if self._input.config.detection.enabled:
                operation = operation_for(tool_name, arguments, text)
                if outcome.output_ref is not None:
                    operation = operation.model_copy(update={"result_hash": outcome.output_hash})
                self._detector.record(operation, self._input.config.detection)
            post = self._post_event(call, tool_name, attempt, arguments, result, outcome)
            self._memo_update(call, tool_name, arguments, outcome)
            # 6e memory: successful results only.
            if not result.is_error:
                if self._input.features.memory and self._input.shadow is None:
                    self._remember(call, tool_name, arguments, text, post)
                # 7
                return result
            # 8 RECOVER
            analysis, action = await self._decide(outcome, text, tool_name, arguments, attempt)
            if not isinstance(action, Retry):
                self._recovery_event(call, tool_name, attempt, analysis, action)
                return result
            new_tool, new_arguments, problem = _correct(
                analysis.correction if analysis else None, tool_name, arguments
            )
            self._recovery_event(call, tool_name, attempt, analysis, action, problem)
            if problem is not None:
                workflow.logger.warning(
                    "correction failed to produce a usable retry: %s (call %r)", problem, call.id
                )
            if action.delay_ms > 0:
                await self._checkpoint(force=True)  # the trail is complete while we wait
                # A durable timer: it lives on the server, so a lost worker loses nothing, and
                # a cancellation interrupts it at once.
                await workflow.sleep(timedelta(milliseconds=action.delay_ms))
            _raise_if_cancelled()
            attempt += 1
            if attempt > MAX_RECOVERY_ATTEMPTS:
                raise ToolRecoveryExhausted(original_tool, attempt)
            tool_name, arguments = new_tool, new_arguments

    async def _gated_attempt(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], attempt: int
    ) -> AttemptOutcome | ToolDispatchResult:
        """Steps 2-5: hooks, the loop pre-check, the gate and the execution.

        Returns the attempt's outcome, or the refusal result when a hook refused it.
        """
        # 2 HOOKS run first thing in the tool activity (sharing its round trip); 3 DETECT is
        # a pure read of the window, decided here; 4 GATE runs in the activity after the hooks.
        check = self._loop_check()
        if check is not None and check.should_stop:
            # Step 2 comes before step 3: a hook's block is the answer, not the loop.
            refusal = await self._hooks_first(call, tool_name, arguments, attempt)
            if refusal is not None:
                return refusal
            self._loop_stop(call, tool_name, arguments, attempt, check)
        hit = self._memo_hit(tool_name, arguments)
        if hit is not None:
            # A memoized result: the hooks still judge the call, but nothing executes (a hit
            # calls no downstream service, so the breaker gate has nothing to protect).
            refusal = await self._hooks_first(call, tool_name, arguments, attempt)
            if refusal is not None:
                return refusal
            self._warn_loop(call, tool_name, attempt, check)
            return hit
        # 5 EXECUTE: a pending cancellation wins before and after the activity.
        _raise_if_cancelled()
        outcome = await self._execute(call, tool_name, arguments, attempt)
        _raise_if_cancelled()
        if outcome.hook is not None:
            refusal = await self._hook_decision(call, tool_name, arguments, attempt, outcome.hook)
            if refusal is not None:
                return refusal
            # Approved by a human: the attempt goes on, without asking the hooks again.
            outcome = await self._execute(call, tool_name, arguments, attempt, skip_pre_hooks=True)
            _raise_if_cancelled()
        if outcome.breaker_refused:
            # 4 GATE refused (decided worker-side, against the shared breaker): soft, no
            # POST phase, no recovery, so a retrying strategy cannot spin against it.
            self._emit(
                "breaker_refused",
                {"tool": tool_name},
                call_id=call.id,
                tool=tool_name,
                attempt=attempt,
            )
            refusal = ToolDispatchResult(
                tool_call_id=call.id,
                output=outcome.output,
                is_error=True,
                duration_ms=0.0,
                resolved_tool_name=tool_name,
            )
            self._post_event(call, tool_name, attempt, arguments, refusal, None)
            return refusal
        self._warn_loop(call, tool_name, attempt, check)
        return outcome

    def _warn_loop(
        self, call: ToolCall, tool_name: str, attempt: int, check: LoopCheck | None
    ) -> None:
        if check is not None and check.pattern is not None:
            # The warn band: observers hear of the pattern; dispatch went ahead.
            self._emit(
                "loop_detected",
                {"pattern": check.pattern, "repetitions": check.repetitions, "stop": False},
                call_id=call.id,
                tool=tool_name,
                attempt=attempt,
            )

    async def _hooks_first(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], attempt: int
    ) -> ToolDispatchResult | None:
        """Ask the pre-tool hooks without executing; the refusal if they refuse."""
        if not self._input.features.hooks:
            return None
        asked = await self._execute(call, tool_name, arguments, attempt, hooks_only=True)
        if asked.hook is None:
            return None
        return await self._hook_decision(call, tool_name, arguments, attempt, asked.hook)

    def _memo_hit(self, tool_name: str, arguments: dict[str, Any]) -> AttemptOutcome | None:
        plan = self._input.memo
        if plan is None or self._input.shadow is not None:
            return None
        entry = self._memo.lookup(plan, tool_name, arguments, self._turn_number)
        if entry is None:
            return None
        return AttemptOutcome(
            output=with_cached_marker(entry.output),
            is_error=False,
            duration_ms=entry.duration_ms,  # the hit replays the original call's duration
            resolved_tool_name=entry.resolved_tool_name,
            display_hint=entry.display_hint,
            cached=True,
        )

    def _memo_update(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], outcome: AttemptOutcome
    ) -> None:
        plan = self._input.memo
        if (
            plan is None
            or outcome.is_error
            or outcome.cached
            or outcome.output_ref is not None
            or self._input.shadow is not None
        ):
            return
        paths = self._input.memo_paths.get(call.id, [])
        self._memo.written(plan, tool_name, paths)
        self._memo.remember(
            plan,
            tool=tool_name,
            arguments=arguments,
            output=outcome.output,
            duration_ms=outcome.duration_ms,
            resolved_tool_name=outcome.resolved_tool_name,
            display_hint=outcome.display_hint,
            turn=self._turn_number,
            paths=paths,
        )

    def _post_event(
        self,
        call: ToolCall,
        tool_name: str,
        attempt: int,
        arguments: dict[str, Any],
        result: ToolDispatchResult,
        outcome: AttemptOutcome | None,
    ) -> AuditEvent:
        payload: dict[str, Any] = {
            "turn": self._turn.turn_id,
            "tool_call_id": call.id,
            "tool": tool_name,
            "result_hash": (
                outcome.output_hash
                if outcome is not None and outcome.output_ref is not None
                else stable_hash(render_text(result.output))
            ),
            "is_error": result.is_error,
            "duration": result.duration_ms,
            "display_hint": result.display_hint,
            "resolved_tool_name": result.resolved_tool_name,
            "input": arguments,
            "output": result.model_dump(mode="json")["output"],
            "started_at": _iso(outcome.started_at) if outcome else None,
            "finished_at": _iso(outcome.finished_at) if outcome else None,
        }
        if outcome is not None and outcome.output_ref is not None:
            payload["output_ref"] = outcome.output_ref
        if outcome is not None and outcome.cached:
            payload["cached"] = True
        if outcome is not None and outcome.dispatch is not None:
            payload["dispatch"] = unpack_dispatch(
                outcome.dispatch,
                call_id=call.id,
                attempt=attempt,
                tool_name=tool_name,
                arguments=arguments,
                output=outcome.output,
            )
        if outcome is not None and outcome.post_hook_errors:
            payload["post_hook_errors"] = outcome.post_hook_errors
        return self._emit("tool_post", payload, call_id=call.id, tool=tool_name, attempt=attempt)

    async def _hook_decision(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        hook: HookDecision,
    ) -> ToolDispatchResult | None:
        """Turn a hook's Block/Ask into the refusal; ``None`` when a human approved the Ask."""
        payload: dict[str, Any] = {"decision": hook.decision, "hook": hook.hook, "text": hook.text}
        text = hook.text
        if hook.decision == "ask":
            if not self._input.config.interactive:
                text = headless_ask_text(hook.text)
                payload["outcome"] = "refused (session not interactive)"
            else:
                answer = await self._await_approval(call, tool_name, arguments, hook.text)
                if answer is None:
                    text = headless_ask_text(hook.text)
                    payload["outcome"] = "refused (no answer in time)"
                elif answer.approved:
                    payload.update(outcome="approved", by=answer.by)
                    self._emit(
                        "hook_decision", payload, call_id=call.id, tool=tool_name, attempt=attempt
                    )
                    return None
                else:
                    text = answer.reason or f"denied by {answer.by or 'a reviewer'}"
                    payload.update(outcome="denied", by=answer.by, reason=answer.reason)
        self._emit("hook_decision", payload, call_id=call.id, tool=tool_name, attempt=attempt)
        # A refusal: reason verbatim, duration 0, no detection, health, memory or recovery.
        result = ToolDispatchResult(
            tool_call_id=call.id,
            output=text,
            is_error=True,
            duration_ms=0.0,
            resolved_tool_name=tool_name,
        )
        self._post_event(call, tool_name, attempt, arguments, result, None)
        return result

    def _loop_check(self) -> LoopCheck | None:
        detection = self._input.config.detection
        return self._detector.check(detection) if detection.enabled else None

    def _loop_stop(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        check: LoopCheck,
    ) -> NoReturn:
        """Refuse the attempt at the stop threshold (spec §10.3): a hard error for the turn."""
        self._emit(
            "loop_detected",
            {"pattern": check.pattern, "repetitions": check.repetitions, "stop": True},
            call_id=call.id,
            tool=tool_name,
            attempt=attempt,
        )
        refusal = ToolDispatchResult(
            tool_call_id=call.id,
            output=check.refusal_text() or "",
            is_error=True,
            duration_ms=0.0,
            resolved_tool_name=tool_name,
        )
        self._post_event(call, tool_name, attempt, arguments, refusal, None)
        self._detector.stop(check)
        raise LoopDetected(check.message or "")

    async def _await_approval(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], question: str
    ) -> ApprovalInput | None:
        """Park the call until the ``approval`` Update arrives or the timeout passes."""
        await self._checkpoint(force=True)  # a human may look at the trail meanwhile
        # A query's answer, not history: adding the times changes no replay.
        asked_at = workflow.now()
        self._waiting[call.id] = PendingApproval(
            tool_call_id=call.id,
            tool_name=tool_name,
            question=question,
            arguments=arguments,
            asked_at=asked_at,
            deadline=asked_at + timedelta(seconds=self._input.config.approval_timeout_s),
        )
        try:
            await workflow.wait_condition(
                lambda: call.id in self._answers,
                timeout=timedelta(seconds=self._input.config.approval_timeout_s),
            )
        except TimeoutError:
            return None
        finally:
            del self._waiting[call.id]
        return self._answers.pop(call.id)

    def _remember(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        text: str,
        post: AuditEvent,
    ) -> None:
        self._memory.append(
            MemoryEntry(
                kind="trajectory",
                content=trajectory(tool_name, canonical_json(arguments), text),
                tool_call_id=call.id,
                created_at=post.created_at,
                seq=post.seq,
                turn_id=self._turn.turn_id,
                session_id=self._turn.session_id,
            )
        )

    async def _decide(
        self,
        outcome: AttemptOutcome,
        text: str,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
    ) -> tuple[Analysis | None, Action]:
        """Ask the reflector (unless it is the no-op one) and let the strategy decide."""
        if outcome.reflector == "noop":
            # What NoopReflector answers, known without a round trip.
            analysis = Analysis(is_recoverable=False, root_cause=text)
        else:
            try:
                reflected: ReflectOutcome = await workflow.execute_activity(
                    RECOVERY_REFLECT,
                    ReflectInput(
                        error=text,
                        tool=tool_name,
                        resolved_tool=outcome.resolved_tool_name,
                        arguments=arguments,
                        attempt=attempt,
                        max_attempts=MAX_RECOVERY_ATTEMPTS,
                    ),
                    result_type=ReflectOutcome,
                    start_to_close_timeout=timedelta(minutes=5),
                    retry_policy=_REFLECT_RETRY,
                )
            except ActivityError as failure:
                _raise_if_cancelled_activity()
                return None, Fail(reason=f"reflector unavailable: {failure.cause or failure}")
            if reflected.analysis is None:
                return None, Fail(reason=reflected.error or text)
            analysis = reflected.analysis
        strategy = self._input.config.recovery
        return analysis, strategy.decide(analysis, attempt, MAX_RECOVERY_ATTEMPTS)

    def _recovery_event(
        self,
        call: ToolCall,
        tool_name: str,
        attempt: int,
        analysis: Analysis | None,
        action: Action,
        correction_problem: str | None = None,
    ) -> None:
        self._emit(
            "recovery_decision",
            {
                "action": action.model_dump(mode="json"),
                "analysis": None if analysis is None else analysis.model_dump(mode="json"),
                "correction_problem": correction_problem,
                "next_attempt": attempt + 1 if isinstance(action, Retry) else None,
            },
            call_id=call.id,
            tool=tool_name,
            attempt=attempt,
        )

    async def _execute(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        *,
        skip_pre_hooks: bool = False,
        hooks_only: bool = False,
    ) -> AttemptOutcome:
        """Run one attempt as an activity; infrastructure failures become soft results."""
        config = self._input.config
        meta = self._input.tools.get(tool_name)
        if meta is not None and meta.timeout_s is not None:
            timeout = timedelta(seconds=meta.timeout_s) + _TIMEOUT_MARGIN
        else:
            timeout = timedelta(seconds=config.tool_timeout_s)
        flush = await self._records_for_activity()
        request = ExecuteAttempt(
            session_id=self._turn.session_id,
            tool_call_id=call.id,
            tool_name=tool_name,
            arguments=arguments,
            attempt=attempt,
            flush=flush,
            skip_pre_hooks=skip_pre_hooks,
            hooks_only=hooks_only,
            shadow=self._input.shadow is not None,
            large_output_bytes=config.large_output_bytes,
            recorded=(
                self._input.shadow.attempts.get(f"{call.id}#{attempt}")
                if self._input.shadow is not None
                else None
            ),
        )
        retry = RetryPolicy(
            initial_interval=timedelta(milliseconds=500),
            maximum_interval=timedelta(seconds=10),
            maximum_attempts=config.infrastructure_retries,
        )
        try:
            if meta is not None and meta.local:
                # @tool(local=True): no round trip to the server, no input in the history,
                # no heartbeats (see the durability trade-off in tooltrail.tools.tool).
                outcome: AttemptOutcome = await workflow.execute_local_activity(
                    TOOL_EXECUTE,
                    request,
                    result_type=AttemptOutcome,
                    start_to_close_timeout=timeout,
                    retry_policy=retry,
                )
            else:
                outcome = await workflow.execute_activity(
                    TOOL_EXECUTE,
                    request,
                    result_type=AttemptOutcome,
                    start_to_close_timeout=timeout,
                    heartbeat_timeout=timedelta(seconds=config.heartbeat_timeout_s),
                    retry_policy=retry,
                )
        except (ActivityError, ApplicationError) as failure:
            if not _handles(failure):
                raise
            # Temporal's infrastructure retries are spent (spec §14): a soft failed attempt.
            self._flushed(flush, written=False)
            cause = failure.cause if isinstance(failure, ActivityError) else None
            return AttemptOutcome(
                output=str(cause or failure),
                is_error=True,
                duration_ms=0.0,
                resolved_tool_name=tool_name,
                flushed=False,
            )
        if not outcome.resolved_tool_name:
            outcome.resolved_tool_name = tool_name  # left unsaid: the requested tool ran
        self._flushed(flush, written=outcome.flushed)
        return outcome
