"""Reading what went wrong: activity failures, cancellation, and the turn's hard errors.

An activity's failure is an answer for the turn (a soft attempt, a failed model call, an
unwritten batch) unless the turn's own cancellation cut the activity short: then the turn
ends *cancelled*. Hard errors leave the workflow as non-retryable ``ApplicationError``s, so
Temporal never retries a turn that the pipeline stopped. Deterministic code only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from tooltrail.core.text import timed_out
from tooltrail.core.wire import ATTEMPT_TIMED_OUT, InfraFailed
from tooltrail.errors import LoopDetected, ToolRecoveryExhausted, TurnError

__all__ = [
    "ATTEMPT_FAILURES",
    "ATTEMPT_TIMEOUTS_PATCH",
    "TIMEOUT_NOT_RETRIED",
    "AttemptFailure",
    "application_error",
    "attempt_failed",
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


ATTEMPT_TIMEOUTS_PATCH = "tooltrail-attempt-timeouts"
"""Patch: an attempt that ran out of its timeout is answered ``Tool '{name}' timed out after
{secs}s``, as the tool's own ``timeout_s`` is (histories before it answered Temporal's words,
``activity StartToClose timeout``). Asked only when an attempt timed out."""

TIMEOUT_NOT_RETRIED = "TemporalTimeout:StartToClose"
"""The retry policy's non-retryable type of a tool attempt's start-to-close timeout.

Temporal's retries of an attempt are for a lost worker (its heartbeats stop: a heartbeat
timeout) and failures inside the activity (the database). An attempt that used up its whole
start-to-close timeout is neither: its body started and hung, and another start would run
the tool again unseen by the trail (a body without ``timeout_s`` was started
``infrastructure_retries`` times). The server matches timeouts by this name."""


def attempt_failed(failure: AttemptFailure, tool_name: str, timeout: timedelta) -> InfraFailed:
    """The soft failed attempt of a tool activity that failed for good.

    An attempt that ran out of ``timeout`` says so in the words of the tool's own timeout
    (since ``ATTEMPT_TIMEOUTS_PATCH``); any other failure, in Temporal's (``infra_failed``).
    """
    if out_of_time(failure) and workflow.patched(ATTEMPT_TIMEOUTS_PATCH):
        return InfraFailed(
            output=timed_out(tool_name, timeout.total_seconds()),
            is_error=True,
            resolved_tool_name=tool_name,
        )
    return infra_failed(failure, tool_name)


def out_of_time(failure: AttemptFailure) -> bool:
    """Whether an attempt failed because it ran out of its timeout (not a lost worker).

    A regular attempt's start-to-close timeout, or the tool activity's own
    ``ATTEMPT_TIMED_OUT`` (a local attempt bounds itself to its time); a local activity's
    timeout as well, which a local attempt recorded before ``ATTEMPT_TIMED_OUT`` may show. A
    heartbeat timeout is a lost worker, and is not this.
    """
    cause = failure.cause if isinstance(failure, ActivityError) else failure
    if isinstance(cause, ApplicationError):
        # The tool activity's own word: the SDK cancelled it for its timeout.
        return cause.type == ATTEMPT_TIMED_OUT
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
