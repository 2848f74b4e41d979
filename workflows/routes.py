"""Tool attempts sent to the workers that have the tool (issue 20 item 5).

Workers with different tool sets may share a task queue. An attempt that lands on a worker
without its tool, while a live peer has it, is refused there before anything runs
(``tooltrail.pipeline.directory``: an ``ApplicationError`` of type ``TOOL_ON_PEER`` naming the
peer's tools queue). The turn then schedules the same attempt again on that queue, with the
same timeouts, heartbeats and retry policy (it is not a new attempt: no recovery, no count),
and sends the tool's later attempts of the turn there directly. One ``tool_routed`` event
says so. While the workers of a queue are alike nothing here runs: attempts stay on the
turn's queue. Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from tooltrail.core.wire import (
    ATTEMPT_OUTCOME,
    LOCAL_ATTEMPT_MARGIN,
    TOOL_EXECUTE,
    TOOL_ON_PEER,
    AttemptOutcome,
    ExecuteAttempt,
)
from tooltrail.workflows.trail import Trail

__all__ = ["TOOL_ON_PEER", "TOOL_ROUTES_PATCH", "ToolRoutes", "routed_to"]

TOOL_ROUTES_PATCH = "tooltrail-tool-routes"
"""Patch: an attempt refused for a peer is sent to the peer's tools queue (histories before
it had no such refusal)."""


def routed_to(failure: ActivityError | ApplicationError) -> str | None:
    """The tools queue an attempt was refused for, if that is why it failed."""
    cause = failure.cause if isinstance(failure, ActivityError) else failure
    if (
        isinstance(cause, ApplicationError)
        and cause.type == TOOL_ON_PEER
        and cause.details
        and isinstance(cause.details[0], str)
    ):
        return cause.details[0]
    return None


class ToolRoutes:
    """The turn's routes: which tools' attempts go to which peer's tools queue."""

    def __init__(self, trail: Trail) -> None:
        """Share the turn's trail (for the ``tool_routed`` events)."""
        self._trail = trail
        self._routes: dict[str, str] = {}

    async def execute(
        self,
        request: ExecuteAttempt,
        *,
        local: bool,
        start_to_close_timeout: timedelta,
        heartbeat_timeout: timedelta,
        retry_policy: RetryPolicy,
    ) -> AttemptOutcome:
        """Run the attempt as an activity, on the queue of a worker that has its tool.

        Args:
            request: the attempt.
            local: run it as a local activity (``@tool(local=True)``) while it is not routed;
                a routed one is a regular activity on the peer's queue (this worker lacks the
                tool, so it cannot run it in place).
            start_to_close_timeout: the attempt's timeout.
            heartbeat_timeout: the regular activity's heartbeat timeout.
            retry_policy: Temporal's retries of the attempt (infrastructure failures).

        Raises:
            ActivityError: the activity failed (a second refusal included).
            ApplicationError: the local activity failed.
        """
        tool_name = request.tool_name
        queue = self._routes.get(tool_name)
        while True:
            try:
                if local and queue is None:
                    # The SDK retries a local activity's start-to-close timeout whatever the
                    # retry policy says: the attempt bounds itself to its time, and fails
                    # for good (ATTEMPT_TIMED_OUT) before that timeout comes.
                    outcome: AttemptOutcome = await workflow.execute_local_activity(
                        TOOL_EXECUTE,
                        request,
                        result_type=ATTEMPT_OUTCOME,
                        start_to_close_timeout=start_to_close_timeout + LOCAL_ATTEMPT_MARGIN,
                        retry_policy=retry_policy,
                    )
                else:
                    outcome = await workflow.execute_activity(
                        TOOL_EXECUTE,
                        request,
                        result_type=ATTEMPT_OUTCOME,
                        start_to_close_timeout=start_to_close_timeout,
                        heartbeat_timeout=heartbeat_timeout,
                        retry_policy=retry_policy,
                        task_queue=queue,
                    )
                return outcome
            except (ActivityError, ApplicationError) as failure:
                peer = routed_to(failure)
                # A tools queue never refuses again; an old history has no refusal at all.
                if peer is None or queue is not None or not workflow.patched(TOOL_ROUTES_PATCH):
                    raise
                queue = self._routes[tool_name] = peer
                self._trail.emit(
                    "tool_routed",
                    {"tool": tool_name, "task_queue": peer},
                    call_id=request.tool_call_id,
                    tool=tool_name,
                    attempt=request.attempt,
                )
