"""``ToolCatalogWorkflow``: ask a worker of the queue which tools it serves.

A worker may register tools a client cannot know of by itself (an MCP server's, listed by
the server when the worker starts); a client learns their names from this workflow instead
of starting the server itself (``Tooltrail.worker_tools``).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from tooltrail.core.wire import TOOL_CATALOG, WorkerCatalog

__all__ = ["ToolCatalogWorkflow"]


@workflow.defn(name="ToolCatalogWorkflow")
class ToolCatalogWorkflow:
    """Returns the catalog of whichever worker of the task queue takes the activity.

    That worker lists its own tools and those of the queue's live peers with other tools.
    """

    @workflow.run
    async def run(self) -> WorkerCatalog:
        """Run the catalog activity."""
        catalog: WorkerCatalog = await workflow.execute_activity(
            TOOL_CATALOG,
            result_type=WorkerCatalog,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return catalog
