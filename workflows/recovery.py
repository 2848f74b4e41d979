"""Step 8 of the pipeline: after a failed attempt, retry it (corrected) or let it stand.

The reflector is host code, so it runs in an activity (unless it is the ``NoopReflector``,
whose answer the workflow knows); the strategy is pure and decides here. The decision and
any correction that could not be applied are events of the trail. Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, assert_never

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from tooltrail.core.recovery import (
    MAX_RECOVERY_ATTEMPTS,
    Action,
    Analysis,
    ApproachChange,
    Correction,
    Escalate,
    Fail,
    InputFix,
    PrerequisiteFix,
    Retry,
    ToolChange,
)
from tooltrail.core.results import ToolCall
from tooltrail.core.wire import (
    RECOVERY_REFLECT,
    AttemptResult,
    InfraFailed,
    MemoHit,
    Ran,
    ReflectInput,
    ReflectOutcome,
    ShadowServed,
)
from tooltrail.workflows.arguments import refused_arguments
from tooltrail.workflows.failures import raise_if_cancelled_activity
from tooltrail.workflows.state import TurnState
from tooltrail.workflows.trail import Trail

__all__ = ["NextAttempt", "Recovery"]

_CHECKED_CORRECTIONS_PATCH = "tooltrail-checked-corrections"
"""A correction naming a tool never advertised, or arguments the turn refuses, is a failed
correction (the retry runs unchanged) instead of reaching the tool activity."""

# A reflector may call a model: give it time, and retry infrastructure failures a little.
_REFLECT_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=3)


@dataclass(frozen=True)
class NextAttempt:
    """A retry the strategy decided: which tool, with what, after how long."""

    tool_name: str
    arguments: dict[str, Any]
    delay_ms: int


def _correct(
    correction: Correction | None, tool: str, arguments: dict[str, Any]
) -> tuple[str, dict[str, Any], str | None]:
    """Apply a correction; return the new tool, input and the failure text (if unusable)."""
    match correction:
        case None | PrerequisiteFix() | ApproachChange() | Escalate():
            # Spec §6.4: recorded with the analysis, skipped; the retry runs unchanged.
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


class Recovery:
    """Decides what follows a failed attempt, on the turn's state and trail."""

    def __init__(self, state: TurnState, trail: Trail) -> None:
        """Share the turn's state (its recovery strategy) and its trail."""
        self._state = state
        self._trail = trail
        self._reflector_error: str | None = None

    async def after_failure(
        self,
        call: ToolCall,
        outcome: AttemptResult,
        text: str,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
    ) -> NextAttempt | None:
        """Decide, and record the decision; ``None`` keeps the failed result (soft)."""
        self._reflector_error = None
        analysis, action = await self._decide(outcome, text, tool_name, arguments, attempt)
        if not isinstance(action, Retry):
            self._event(call, tool_name, attempt, analysis, action)
            return None
        new_tool, new_arguments, problem = _correct(
            analysis.correction if analysis else None, tool_name, arguments
        )
        unchecked = problem is None and (new_tool, new_arguments) != (tool_name, arguments)
        if unchecked:
            # A correction passes the checks the model's calls pass before dispatch: a tool
            # the model was never offered, or arguments too large or deep to send, would
            # otherwise reach the tool activity through the reflector.
            refused = self._check_correction(new_tool, new_arguments)
            if refused is not None and workflow.patched(_CHECKED_CORRECTIONS_PATCH):
                new_tool, new_arguments, problem = tool_name, arguments, refused
        self._event(call, tool_name, attempt, analysis, action, problem)
        if problem is not None:
            workflow.logger.warning(
                "correction failed to produce a usable retry: %s (call %r)", problem, call.id
            )
        return NextAttempt(tool_name=new_tool, arguments=new_arguments, delay_ms=action.delay_ms)

    def _check_correction(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """The failure text of a correction the model's call could not have made, or None."""
        if tool not in self._state.advertised:
            return f"ToolChange correction names tool '{tool}', which was not advertised"
        problem = refused_arguments(arguments, self._state.input.config.max_argument_bytes)
        if problem is not None:
            return f"InputFix correction modified_input refused: {problem}"
        return None

    async def _decide(
        self,
        outcome: AttemptResult,
        text: str,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
    ) -> tuple[Analysis | None, Action]:
        """Ask the reflector (unless it is the no-op one) and let the strategy decide."""
        match outcome:
            case Ran(reflector=reflector) | ShadowServed(reflector=reflector):
                pass
            case MemoHit() | InfraFailed():
                reflector = None  # no worker said which reflector it has: ask it
            case _:
                assert_never(outcome)
        if reflector == "noop":
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
                raise_if_cancelled_activity()
                # Spec §6.1: Fail(error_msg), no correction; the event says what broke.
                self._reflector_error = f"reflector unavailable: {failure.cause or failure}"
                return None, Fail(reason=text)
            if reflected.analysis is None:
                self._reflector_error = reflected.error
                return None, Fail(reason=text)
            analysis = reflected.analysis
        strategy = self._state.input.config.recovery
        return analysis, strategy.decide(analysis, attempt, MAX_RECOVERY_ATTEMPTS)

    def _event(
        self,
        call: ToolCall,
        tool_name: str,
        attempt: int,
        analysis: Analysis | None,
        action: Action,
        correction_problem: str | None = None,
    ) -> None:
        self._trail.emit(
            "recovery_decision",
            {
                "action": action.model_dump(mode="json"),
                "analysis": None if analysis is None else analysis.model_dump(mode="json"),
                "correction_problem": correction_problem,
                **({"reflector_error": self._reflector_error} if self._reflector_error else {}),
                "next_attempt": attempt + 1 if isinstance(action, Retry) else None,
            },
            call_id=call.id,
            tool=tool_name,
            attempt=attempt,
        )
