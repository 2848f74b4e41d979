"""What a durable tool call costs: tooltrail vs the raw Temporal floor vs a direct call.

- direct: the tool's validation and body in-process (no durability at all);
- floor: a plain Temporal workflow with one plain activity per call (the engine's minimum);
- tooltrail: a TurnWorkflow with the full pipeline and the SQL audit trail.

One no-op call per turn, and 50 sequential calls per turn, on the embedded dev server with
tooltrail's settings. Run: ``python -m bench.overhead`` (or ``make bench``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporalio.worker import Worker

from bench.common import embedded, median, report, timed
from bench.floor import FloorWorkflow, noop
from tooltrail import Host, ToolCall, ToolContext, tool
from tooltrail.scratch import ScratchDirs

REPEAT = 15


@tool
async def nothing(text: str) -> str:
    """Return the text."""
    return text


async def direct(calls: int) -> None:
    ctx = ToolContext("s", "t", "c", 0, Path(ScratchDirs().ensure("bench")))
    for i in range(calls):
        await nothing.invoke(ctx, nothing.validate({"text": f"c{i}"}))


async def main() -> None:
    rows = []
    async with embedded(Host([nothing])) as tt:
        floor_queue = f"floor-{uuid.uuid4()}"
        async with Worker(
            tt.client, task_queue=floor_queue, workflows=[FloorWorkflow], activities=[noop]
        ):
            for calls in (1, 50):
                batch = [ToolCall(f"c{i}", "nothing", {"text": f"c{i}"}) for i in range(calls)]
                repeat = REPEAT if calls == 1 else 3

                async def durable(batch: list[ToolCall] = batch) -> None:
                    await tt.run_turn(batch, session_id=f"bench-{uuid.uuid4()}")

                async def floor(calls: int = calls) -> None:
                    await tt.client.execute_workflow(
                        "BenchFloorWorkflow",
                        calls,
                        id=f"floor-{uuid.uuid4()}",
                        task_queue=floor_queue,
                    )

                async def in_process(calls: int = calls) -> None:
                    await direct(calls)

                await durable()
                await floor()  # warm both paths
                per_call = {
                    "direct": median(await timed(in_process, repeat)) / calls,
                    "floor": median(await timed(floor, repeat)) / calls,
                    "tooltrail": median(await timed(durable, repeat)) / calls,
                }
                rows.append(
                    [
                        f"{calls} call(s) per turn",
                        per_call["direct"],
                        per_call["floor"],
                        per_call["tooltrail"],
                        per_call["tooltrail"] / per_call["floor"],
                    ]
                )
    report(
        "overhead",
        ["turn shape", "direct ms/call", "floor ms/call", "tooltrail ms/call", "tooltrail / floor"],
        rows,
        {"repeat": REPEAT},
    )


if __name__ == "__main__":
    asyncio.run(main())
