"""Reading what went wrong: activity failures, cancellation, and the turn's hard errors.

An activity's failure is an answer for the turn (a soft attempt, a failed model call, an
unwritten batch) unless the turn's own cancellation cut the activity short: then the turn
ends *cancelled*. Hard errors leave the workflow as non-retryable ``ApplicationError``s, so
Temporal never retries a turn that the pipeline stopped. Deterministic code only.
"""

from __future__ import annotations

import asyncio

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from tooltrail.core.wire import InfraFailed
from tooltrail.errors import LoopDetected, ToolRecoveryExhausted, TurnError

__all__ = [
    "ATTEMPT_FAILURES",
    "AttemptFailure",
    "application_error",
    "cancelling",
    "failure_text",
    "infra_failed",
    "out_of_time",
    "raise_if_cancelled",
    "raise_if_cancelled_activity",
]

# An activity's failure reaches the workflow wrapped in an ActivityError; a local activity's
# is its own ApplicationError (its timeouts are wrapped either way). So wherever an activity's
# failure is an answer, the turn catches both.

AttemptFailure = ActivityError | ApplicationError | TemporalTimeoutError
"""What a failed tool attempt raises in the workflow."""

ATTEMPT_FAILURES = (ActivityError, ApplicationError, TemporalTimeoutError)
"""The classes of ``AttemptFailure``, to catch. A local attempt's timeout arrives wrapped in an
``ActivityError`` when it happens, but bare when a worker replays it (the SDK rebuilds it from
the history's marker): a turn whose local attempt timed out could not be replayed without it."""


def failure_text(failure: AttemptFailure) -> str:
    """What failed: a regular activity's cause, or a local activity's own error."""
    cause = failure.cause if isinstance(failure, ActivityError) else None
    return str(cause or failure)


def infra_failed(failure: AttemptFailure, tool_name: str) -> InfraFailed:
    """The soft failed attempt of an activity whose infrastructure retries are spent (§14)."""
    return InfraFailed(
        output=failure_text(failure),
        is_error=True,
        duration_ms=0.0,
        resolved_tool_name=tool_name,
    )


def out_of_time(failure: AttemptFailure) -> bool:
    """Whether an attempt failed because it ran out of its timeout (not a lost worker).

    A regular attempt's start-to-close timeout, or a local one's schedule-to-close (which
    bounds a local attempt with its retries: ``workflows.routes``); a heartbeat timeout is a
    lost worker, and is not this.
    """
    cause = failure.cause if isinstance(failure, ActivityError) else failure
    return isinstance(cause, TemporalTimeoutError) and cause.type in (
        TimeoutType.START_TO_CLOSE,
        TimeoutType.SCHEDULE_TO_CLOSE,
    )


def cancelling() -> bool:
    """Whether the turn's cancellation has been requested."""
    # Temporal delivers workflow cancellation by cancelling the run task.
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def raise_if_cancelled() -> None:
    """End the turn cancelled when its cancellation is pending.

    When a result and the cancellation arrive together, the pending request must win
    (spec §9.5).
    """
    if cancelling():
        raise asyncio.CancelledError()


def raise_if_cancelled_activity() -> None:
    """Where an activity failed: end the turn cancelled if its cancellation cut it short.

    An activity cut short by the turn's cancellation resolves as a failed activity; where
    that failure is an answer (the model call failed, the reflector was unavailable, an
    audit batch was not written), the turn would otherwise go on with it.
    """
    if cancelling():
        raise asyncio.CancelledError()


def application_error(hard: TurnError) -> ApplicationError:
    """The non-retryable ``ApplicationError`` a hard error leaves the workflow as (spec §1)."""
    if isinstance(hard, ToolRecoveryExhausted):
        return ApplicationError(
            str(hard),
            hard.tool,
            hard.attempts,
            type="ToolRecoveryExhausted",
            non_retryable=True,
        )
    if isinstance(hard, LoopDetected):
        return ApplicationError(str(hard), hard.message, type="LoopDetected", non_retryable=True)
    return ApplicationError(str(hard), type=type(hard).__name__, non_retryable=True)
