"""How many one-call turns per second one worker finishes: N concurrent turns, N = 20, 50, 100.

Every turn has one no-op call and its own session; all N are started at once and the wall
time runs until the last one has its results. The floor is N concurrent plain workflows of
one plain activity each on the same server (both started eagerly).
Run: ``python -m bench.throughput``.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from temporalio.worker import Worker

from bench.common import embedded, median, report
from bench.floor import FloorWorkflow, noop
from tooltrail import Host, ToolCall, Tooltrail, tool

CONCURRENCY = (20, 50, 100)
REPEAT = 3


@tool
async def nothing(text: str) -> str:
    """Return the text."""
    return text


async def durable_wave(tt: Tooltrail, n: int) -> float:
    """Run ``n`` one-call turns at once; return the wall time in seconds."""

    async def one(i: int) -> None:
        turn = await tt.run_turn(
            [ToolCall("c0", "nothing", {"text": f"t{i}"})], session_id=f"bench-{uuid.uuid4()}"
        )
        if turn.results[0].is_error:
            raise RuntimeError(f"turn {turn.turn_id}: {turn.results[0].output}")

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - started


async def floor_wave(tt: Tooltrail, queue: str, n: int) -> float:
    """Run ``n`` one-activity floor workflows at once; return the wall time in seconds."""
    started = time.perf_counter()
    await asyncio.gather(
        *(
            tt.client.execute_workflow(
                "BenchFloorWorkflow",
                1,
                id=f"floor-{uuid.uuid4()}",
                task_queue=queue,
                request_eager_start=True,  # started as tooltrail starts a turn
            )
            for _ in range(n)
        )
    )
    return time.perf_counter() - started


async def main() -> None:
    rows = []
    async with embedded(Host([nothing])) as tt:
        floor_queue = f"floor-{uuid.uuid4()}"
        async with Worker(
            tt.client, task_queue=floor_queue, workflows=[FloorWorkflow], activities=[noop]
        ):
            await durable_wave(tt, 5)
            await floor_wave(tt, floor_queue, 5)  # warm both paths
            for n in CONCURRENCY:
                durable = median([await durable_wave(tt, n) for _ in range(REPEAT)])
                floor = median([await floor_wave(tt, floor_queue, n) for _ in range(REPEAT)])
                rows.append(
                    [
                        f"{n} concurrent turns",
                        durable * 1000,
                        n / durable,
                        floor * 1000,
                        n / floor,
                        (n / durable) / (n / floor),
                    ]
                )
    report(
        "throughput",
        [
            "wave",
            "tooltrail wave ms",
            "tooltrail turns/s",
            "floor wave ms",
            "floor workflows/s",
            "tooltrail / floor",
        ],
        rows,
        {"repeat": REPEAT, "worker": "one embedded worker (tooltrail defaults)"},
    )


if __name__ == "__main__":
    asyncio.run(main())
