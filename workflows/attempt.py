"""One call through the per-attempt pipeline (spec §2.1), retries included.

Control lives here: the attempt counter, the loop pre-check and record, the memoize cache,
the recovery decision and its corrections, and the call's events. Everything host-wired
(hooks, the breaker gate, the middleware and the tool body, post hooks) runs in the tool
activity, whose outcome comes back as a tagged ``AttemptOutcome`` that is matched here
exhaustively. Deterministic code only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NoReturn, assert_never

from temporalio import workflow

from tooltrail.core.detection import LoopCheck, operation_for, primary_value
from tooltrail.core.envelopes import open_outcome
from tooltrail.core.hooks import HookDecision
from tooltrail.core.memoize import MemoEntry
from tooltrail.core.recovery import MAX_RECOVERY_ATTEMPTS
from tooltrail.core.results import ToolCall, ToolDispatchResult
from tooltrail.core.text import BREAKER_OPEN, canonical_json, render_text, stable_hash, trajectory
from tooltrail.core.wire import (
    AttemptOutcome,
    AttemptResult,
    AuditEvent,
    BreakerRefused,
    HookRefused,
    HooksPassed,
    InfraFailed,
    MemoHit,
    MemoryEntry,
    Ran,
    ShadowServed,
)
from tooltrail.errors import LoopDetected, ToolRecoveryExhausted
from tooltrail.workflows.approvals import Approvals
from tooltrail.workflows.failures import (
    ATTEMPT_FAILURES,
    attempt_failed,
    raise_if_cancelled,
)
from tooltrail.workflows.memo import memo_hit, memo_in_place, memo_update
from tooltrail.workflows.recovery import Recovery
from tooltrail.workflows.requests import schedule
from tooltrail.workflows.routes import ToolRoutes
from tooltrail.workflows.state import TurnState
from tooltrail.workflows.trail import Trail

__all__ = ["CallPipeline"]

APPROVAL_RECHECKS_LOOP = "approval-rechecks-loop"
"""Patch: an approved ``Ask`` reads the loop pre-check again (histories before it reused the
check taken before the wait)."""

# Bounded state: a turn's inline output budget (TurnState); the memo cache's is in .memo.
_INLINE_BUDGET_PATCH = "tooltrail-inline-budget"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _refusal(call: ToolCall, tool_name: str, text: str) -> ToolDispatchResult:
    # A refusal before execution: reason verbatim, duration 0 (spec §13).
    return ToolDispatchResult(
        tool_call_id=call.id,
        output=text,
        is_error=True,
        duration_ms=0.0,
        resolved_tool_name=tool_name,
    )


class CallPipeline:
    """Runs calls through the per-attempt pipeline, on the turn's state and trail."""

    def __init__(self, state: TurnState, trail: Trail) -> None:
        """Share the turn's state and its trail."""
        self._state = state
        self._trail = trail
        self._recovery = Recovery(state, trail)
        self._approvals = Approvals(state, trail)
        self._routes = ToolRoutes(trail)

    async def dispatch(self, call: ToolCall, arguments: dict[str, Any]) -> ToolDispatchResult:
        """Run the per-attempt pipeline (spec §2.1) for one call, retries included."""
        state = self._state
        config = state.input.config
        original_tool = call.name
        tool_name = call.name
        attempt = 0
        while True:
            # 1 PRE
            self._trail.emit(
                "tool_pre",
                {"turn": state.record.turn_id, "tool": tool_name, "tool_call_id": call.id},
                call_id=call.id,
                tool=tool_name,
                attempt=attempt,
            )
            outcome = await self._gated_attempt(call, tool_name, arguments, attempt)
            if isinstance(outcome, ToolDispatchResult):
                return outcome  # refused before execution: no POST phase, no recovery
            # The model-issued id is stamped here, whatever the layers below returned.
            ran = outcome if isinstance(outcome, Ran) else None
            result = ToolDispatchResult(
                tool_call_id=call.id,
                output=outcome.output,
                is_error=outcome.is_error,
                duration_ms=outcome.duration_ms,
                resolved_tool_name=outcome.resolved_tool_name or tool_name,
                display_hint=outcome.display_hint,
                output_ref=ran.output_ref if ran is not None else None,
            )
            # 6 POST: a. record detection before observers hear of the result; b. on_tool_post
            # (6c post hooks ran in the activity, after the body; 6d health joins there)
            # A large output stayed in the database: its hash and first characters came back.
            stored = ran is not None and ran.output_ref is not None
            text = (
                (ran.output_preview or "")
                if ran is not None and stored
                else render_text(result.output)
            )
            if config.detection.enabled:
                meta = state.plan.tools.get(tool_name)
                primary = primary_value(arguments, meta.primary_param if meta else None)
                operation = operation_for(tool_name, arguments, text, primary)
                if ran is not None and stored:
                    operation = operation.model_copy(update={"result_hash": ran.output_hash})
                state.detector.record(operation, config.detection)
            post = self._post_event(call, tool_name, attempt, arguments, result, outcome)
            memo_update(self._state, call, tool_name, arguments, outcome)
            # 6e memory: successful results only.
            if not result.is_error:
                if state.plan.features.memory and state.input.shadow is None:
                    self._remember(call, tool_name, arguments, text, post)
                # 7
                return result
            # 8 RECOVER
            retry = await self._recovery.after_failure(
                call, outcome, text, tool_name, arguments, attempt
            )
            if retry is None:
                return result
            if retry.delay_ms > 0:
                await self._trail.checkpoint(force=True)  # the trail is complete while we wait
                # A durable timer: it lives on the server, so a lost worker loses nothing, and
                # a cancellation interrupts it at once.
                await workflow.sleep(timedelta(milliseconds=retry.delay_ms))
            raise_if_cancelled()
            attempt += 1
            if attempt > MAX_RECOVERY_ATTEMPTS:
                raise ToolRecoveryExhausted(original_tool, attempt)
            tool_name, arguments = retry.tool_name, retry.arguments

    async def _gated_attempt(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], attempt: int
    ) -> AttemptResult | ToolDispatchResult:
        """Steps 2-5: hooks, the loop pre-check, the gate and the execution.

        Returns the attempt's outcome, or the refusal result when it was refused.
        """
        # 2 HOOKS run first thing in the tool activity (sharing its round trip); 3 DETECT is
        # a pure read of the window, decided here; 4 GATE runs in the activity after the hooks.
        check = self._state.loop_check()
        if check is not None and check.should_stop:
            # Step 2 comes before step 3: a hook's block is the answer, not the loop.
            refusal = await self._hooks_first(call, tool_name, arguments, attempt)
            if refusal is not None:
                return refusal
            self._loop_stop(call, tool_name, arguments, attempt, check)
        hit = memo_hit(self._state, tool_name, arguments)
        if hit is not None:
            # A memoized result: the hooks still judge the call, but nothing executes (a hit
            # calls no downstream service, so the breaker gate has nothing to protect).
            refusal = await self._hooks_first(call, tool_name, arguments, attempt)
            if refusal is not None:
                return refusal
            self._warn_loop(call, tool_name, attempt, check)
            return hit
        # 5 EXECUTE: a pending cancellation wins before and after the activity.
        raise_if_cancelled()
        memo = memo_in_place(self._state, tool_name, arguments)
        outcome = await self._execute(call, tool_name, arguments, attempt, memo=memo)
        raise_if_cancelled()
        while True:
            match outcome:
                case HookRefused(hook=hook):
                    refusal = await self._hook_decision(call, tool_name, arguments, attempt, hook)
                    if refusal is not None:
                        return refusal
                    # Approved by a human: the attempt goes on at step 3 (spec §7). While it
                    # waited, parallel siblings recorded their attempts: the pre-check is read
                    # again, not the one taken before the wait.
                    if hook.decision == "ask" and workflow.patched(APPROVAL_RECHECKS_LOOP):
                        check = self._state.loop_check()
                        if check is not None and check.should_stop:
                            self._loop_stop(call, tool_name, arguments, attempt, check)
                    # The hooks are not asked again.
                    outcome = await self._execute(
                        call, tool_name, arguments, attempt, skip_pre_hooks=True, memo=memo
                    )
                    raise_if_cancelled()
                case BreakerRefused():
                    # Step 3 came before the gate: its pattern is reported even when the gate
                    # then refuses (spec §8: at every pre-check).
                    self._warn_loop(call, tool_name, attempt, check)
                    # 4 GATE refused (decided worker-side, against the shared breaker): soft,
                    # no POST phase, no recovery, so a retrying strategy cannot spin against it.
                    self._trail.emit(
                        "breaker_refused",
                        {"tool": tool_name},
                        call_id=call.id,
                        tool=tool_name,
                        attempt=attempt,
                    )
                    refusal = _refusal(call, tool_name, BREAKER_OPEN)
                    self._post_event(call, tool_name, attempt, arguments, refusal, None)
                    return refusal
                case HooksPassed():
                    # Only a hooks-only attempt answers so; a full one cannot.
                    outcome = InfraFailed(
                        output=f"the tool activity skipped attempt {attempt} of call {call.id!r}",
                        is_error=True,
                        resolved_tool_name=tool_name,
                    )
                case Ran() | ShadowServed() | MemoHit() | InfraFailed():
                    self._warn_loop(call, tool_name, attempt, check)
                    return outcome
                case _:
                    assert_never(outcome)

    def _warn_loop(
        self, call: ToolCall, tool_name: str, attempt: int, check: LoopCheck | None
    ) -> None:
        if check is not None and check.pattern is not None:
            # The warn band: observers hear of the pattern; dispatch went ahead.
            self._trail.emit(
                "loop_detected",
                {
                    "pattern": check.pattern,
                    "repetitions": check.repetitions,
                    "stop": False,
                    "warning": self._state.loop_warning(check),
                },
                call_id=call.id,
                tool=tool_name,
                attempt=attempt,
            )

    async def _hooks_first(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], attempt: int
    ) -> ToolDispatchResult | None:
        """Ask the pre-tool hooks without executing; the refusal if they refuse."""
        if not self._state.plan.features.hooks:
            return None
        asked = await self._execute(call, tool_name, arguments, attempt, hooks_only=True)
        match asked:
            case HookRefused(hook=hook):
                return await self._hook_decision(call, tool_name, arguments, attempt, hook)
            case HooksPassed() | InfraFailed() | Ran() | ShadowServed() | BreakerRefused():
                # No hook refused (hooks that could not be asked do not refuse either).
                return None
            case MemoHit():
                return None  # never an activity's answer; the hooks did not refuse
            case _:
                assert_never(asked)

    def _post_event(
        self,
        call: ToolCall,
        tool_name: str,
        attempt: int,
        arguments: dict[str, Any],
        result: ToolDispatchResult,
        outcome: AttemptResult | None,
    ) -> AuditEvent:
        ran = outcome if isinstance(outcome, Ran) else None
        stored = ran is not None and ran.output_ref is not None
        payload: dict[str, Any] = {
            "turn": self._state.record.turn_id,
            "tool_call_id": call.id,
            "tool": tool_name,
            "result_hash": (
                ran.output_hash
                if ran is not None and stored
                else stable_hash(render_text(result.output))
            ),
            "is_error": result.is_error,
            "duration": result.duration_ms,
            "display_hint": result.display_hint,
            "resolved_tool_name": result.resolved_tool_name,
            "input": arguments,
            "output": result.model_dump(mode="json")["output"],
            "started_at": _iso(ran.started_at) if ran is not None else None,
            "finished_at": _iso(ran.finished_at) if ran is not None else None,
        }
        if ran is not None and ran.output_ref is not None:
            payload["output_ref"] = ran.output_ref
        if isinstance(outcome, MemoHit) or (ran is not None and ran.memo_served):
            payload["cached"] = True
        if ran is not None and ran.dispatch is not None:
            payload["dispatch"] = ran.dispatch
        if ran is not None and ran.post_hook_errors:
            payload["post_hook_errors"] = ran.post_hook_errors
        if ran is not None and ran.lost_attempts:
            # Temporal attempts that started and were lost with their workers (a crash).
            payload["lost_attempts"] = ran.lost_attempts
        return self._trail.emit(
            "tool_post",
            payload,
            call_id=call.id,
            tool=tool_name,
            attempt=attempt,
            temporal_attempt=ran.temporal_attempt if ran is not None else None,
            worker=(ran.worker or None) if ran is not None else None,
        )

    async def _hook_decision(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        hook: HookDecision,
    ) -> ToolDispatchResult | None:
        """Turn a hook's Block/Ask into the refusal; ``None`` when a human approved the Ask."""
        text = await self._approvals.refusal_text(call, tool_name, arguments, attempt, hook)
        if text is None:
            return None
        # A refusal: reason verbatim, duration 0, no detection, health, memory or recovery.
        result = _refusal(call, tool_name, text)
        self._post_event(call, tool_name, attempt, arguments, result, None)
        return result

    def _loop_stop(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        check: LoopCheck,
    ) -> NoReturn:
        """Refuse the attempt at the stop threshold (spec §10.3): a hard error for the turn."""
        self._trail.emit(
            "loop_detected",
            {
                "pattern": check.pattern,
                "repetitions": check.repetitions,
                "stop": True,
                "warning": self._state.loop_warning(check),
            },
            call_id=call.id,
            tool=tool_name,
            attempt=attempt,
        )
        refusal = _refusal(call, tool_name, check.refusal_text() or "")
        self._post_event(call, tool_name, attempt, arguments, refusal, None)
        self._state.detector.stop(check)
        raise LoopDetected(check.message or "")

    def _remember(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        text: str,
        post: AuditEvent,
    ) -> None:
        record = self._state.record
        self._trail.remember(
            MemoryEntry(
                kind="trajectory",
                content=trajectory(tool_name, canonical_json(arguments), text),
                tool_call_id=call.id,
                created_at=post.created_at,
                seq=post.seq,
                turn_id=record.turn_id,
                session_id=record.session_id,
            )
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
        memo: MemoEntry | None = None,
    ) -> AttemptOutcome:
        """Run one attempt as an activity; infrastructure failures become soft outcomes."""
        await self._trail.checkpoint()  # a batch of the trail first, when one is due
        # The turn's inline budget: this attempt may keep at most ``reserved`` bytes of output
        # in history; a larger output goes to the database (the claim check) like a large one.
        config = self._state.input.config
        reserved = self._state.reserve_inline(config)
        limit = config.large_output_bytes
        if reserved != limit and workflow.patched(_INLINE_BUDGET_PATCH):
            limit = max(1, reserved)
        try:
            outcome = await self._run_attempt(
                call, tool_name, arguments, attempt, limit, skip_pre_hooks, hooks_only, memo
            )
        except BaseException:
            self._state.release_inline(reserved)
            raise
        self._state.release_inline(reserved, outcome)
        return outcome

    async def _run_attempt(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        large_output_bytes: int,
        skip_pre_hooks: bool,
        hooks_only: bool,
        memo: MemoEntry | None,
    ) -> AttemptOutcome:
        request, timeout, retry, local = schedule(
            self._state,
            call,
            tool_name,
            arguments,
            attempt,
            large_output_bytes=large_output_bytes,
            skip_pre_hooks=skip_pre_hooks,
            hooks_only=hooks_only,
            memo=memo,
        )
        config = self._state.input.config
        try:
            # On the turn's queue (@tool(local=True): as a local activity, see the durability
            # trade-off in tooltrail.tools.tool), or on a peer's that has the tool (.routes).
            outcome = await self._routes.execute(
                request,
                local=local,
                start_to_close_timeout=timeout,
                heartbeat_timeout=timedelta(seconds=config.heartbeat_timeout_s),
                retry_policy=retry,
            )
        except ATTEMPT_FAILURES as failure:
            # Temporal's infrastructure retries are spent (spec §14), or the attempt ran out
            # of time: a soft failed attempt.
            return attempt_failed(failure, tool_name, timeout)
        # What the activity left unsaid (the request says it) comes back first.
        outcome = open_outcome(outcome, request)
        match outcome:
            case Ran() | ShadowServed() | HookRefused() | HooksPassed() | BreakerRefused():
                return outcome
            case MemoHit() | InfraFailed():
                # Outcomes only the workflow makes: the activity cannot have sent one.
                return InfraFailed(
                    output=f"the tool activity answered with a {outcome.kind!r} outcome",
                    is_error=True,
                    resolved_tool_name=tool_name,
                )
            case _:
                assert_never(outcome)
