"""``CloseSessionWorkflow``: end a session on the worker side (scratch directory removal)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from tooltrail.core.wire import SESSION_CLEANUP, CloseSessionInput

__all__ = ["CloseSessionWorkflow"]

# The cleanup's bounds, shared with an agent run's own cleanup at its end.
CLEANUP_TIMEOUT = timedelta(seconds=60)
CLEANUP_RETRY = RetryPolicy(maximum_attempts=3)


@workflow.defn(name="CloseSessionWorkflow")
class CloseSessionWorkflow:
    """Removes a session's scratch directory; best-effort, so it never fails the caller."""

    @workflow.run
    async def run(self, inp: CloseSessionInput) -> bool:
        """Run the cleanup activity; return whether a directory was removed."""
        try:
            removed: bool = await workflow.execute_activity(
                SESSION_CLEANUP,
                inp,
                result_type=bool,
                start_to_close_timeout=CLEANUP_TIMEOUT,
                retry_policy=CLEANUP_RETRY,
            )
        except ActivityError as failure:
            workflow.logger.warning("scratch cleanup of %r failed: %s", inp.session_id, failure)
            return False
        return removed
