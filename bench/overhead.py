"""What a durable tool call costs: tooltrail vs the raw Temporal floor vs a direct call.

- direct: the tool's validation and body in-process (no durability at all);
- floor: a plain Temporal workflow with one plain activity per call (the engine's minimum),
  started plainly, and started eagerly (``request_eager_start``, as tooltrail's client
  starts a turn: the worker in the same process gets the first workflow task at once);
- tooltrail: a TurnWorkflow with the full pipeline and the SQL audit trail;
- tooltrail local: the same no-op tool declared ``@tool(local=True)`` (a local activity).

Milliseconds per call, for one no-op call per turn and 50 sequential calls per turn (median
of the runs). Each pair runs on two embedded dev servers in turn: one with Temporal's
defaults, one with tooltrail's settings (``DEV_SERVER_ARGS``: the transfer-queue poll limit
raised), to show what that setting buys.
Run: ``python -m bench.overhead`` (or ``make bench``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from temporalio.worker import Worker

from bench.common import embedded, median, report, timed
from bench.floor import FloorWorkflow, noop
from tooltrail import Host, ToolCall, ToolContext, Tooltrail, tool
from tooltrail.runtime.embedded import DEV_SERVER_ARGS
from tooltrail.tools.scratch import ScratchDirs

REPEAT = 15
SHAPES = (1, 50)


@tool
async def nothing(text: str) -> str:
    """Return the text."""
    return text


@tool(local=True)
async def nothing_local(text: str) -> str:
    """Return the text (a local activity)."""
    return text


async def direct(calls: int) -> None:
    ctx = ToolContext("s", "t", "c", 0, Path(ScratchDirs().ensure("bench")))
    for i in range(calls):
        await nothing.invoke(ctx, nothing.validate({"text": f"c{i}"}))


@contextlib.asynccontextmanager
async def server(extra_args: Sequence[str]) -> AsyncIterator[Tooltrail]:
    """A dev server with ``extra_args``, a tooltrail worker and a floor worker, SQLite audit."""
    async with (
        embedded(Host([nothing, nothing_local]), server_args=extra_args) as tt,
        Worker(tt.client, task_queue="floor", workflows=[FloorWorkflow], activities=[noop]),
    ):
        yield tt


async def measure(tt: Tooltrail, calls: int) -> dict[str, float]:
    """Per-call milliseconds of the floor, tooltrail and tooltrail with a local tool."""
    repeat = REPEAT if calls == 1 else 3

    def turn(name: str) -> list[ToolCall]:
        return [ToolCall(f"c{i}", name, {"text": f"c{i}"}) for i in range(calls)]

    async def durable() -> None:
        await tt.run_turn(turn("nothing"), session_id=f"bench-{uuid.uuid4()}")

    async def durable_local() -> None:
        await tt.run_turn(turn("nothing_local"), session_id=f"bench-{uuid.uuid4()}")

    async def floor() -> None:
        await tt.client.execute_workflow(
            "BenchFloorWorkflow", calls, id=f"floor-{uuid.uuid4()}", task_queue="floor"
        )

    async def floor_eager() -> None:
        await tt.client.execute_workflow(
            "BenchFloorWorkflow",
            calls,
            id=f"floor-{uuid.uuid4()}",
            task_queue="floor",
            request_eager_start=True,
        )

    for warm in (durable, durable_local, floor, floor_eager):
        await warm()
    return {
        "floor": median(await timed(floor, repeat)) / calls,
        "floor_eager": median(await timed(floor_eager, repeat)) / calls,
        "tooltrail": median(await timed(durable, repeat)) / calls,
        "local": median(await timed(durable_local, repeat)) / calls,
    }


async def main() -> None:
    results: dict[tuple[str, int], dict[str, float]] = {}
    for label, args in (("defaults", ()), ("tuned", DEV_SERVER_ARGS)):
        async with server(args) as tt:
            for calls in SHAPES:
                results[label, calls] = await measure(tt, calls)
    rows = []
    for calls in SHAPES:
        plain, tuned = results["defaults", calls], results["tuned", calls]
        in_process = median(await timed(lambda calls=calls: direct(calls), REPEAT)) / calls
        rows.append(
            [
                calls,
                in_process,
                plain["floor"],
                plain["tooltrail"],
                tuned["floor"],
                tuned["floor_eager"],
                tuned["tooltrail"],
                tuned["local"],
                tuned["tooltrail"] / tuned["floor"],
                tuned["tooltrail"] / tuned["floor_eager"],
                tuned["local"] / tuned["floor"],
            ]
        )
    report(
        "overhead",
        [
            "calls/turn",
            "direct ms",
            "floor ms (server defaults)",
            "tooltrail ms (server defaults)",
            "floor ms",
            "floor ms (eager start)",
            "tooltrail ms",
            "local tool ms",
            "tooltrail / floor",
            "tooltrail / eager floor",
            "local / floor",
        ],
        rows,
        {"repeat": REPEAT, "server_args": list(DEV_SERVER_ARGS)},
    )


if __name__ == "__main__":
    asyncio.run(main())
