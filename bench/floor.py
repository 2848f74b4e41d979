"""The engine's floor: a plain Temporal workflow running one plain activity per call."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench.noop")
async def noop(text: str) -> str:
    """Do nothing."""
    return text


@workflow.defn(name="BenchFloorWorkflow")
class FloorWorkflow:
    """N sequential no-op activities."""

    @workflow.run
    async def run(self, calls: int) -> int:
        """Run the activities one after the other."""
        for i in range(calls):
            await workflow.execute_activity(
                "bench.noop", f"c{i}", start_to_close_timeout=timedelta(seconds=30)
            )
        return calls
