"""Does a call cost the same in a big turn? 1, 10, 100 and 500 sequential no-op calls per turn.

Per turn size: wall time per call, Temporal history events per call and history bytes per
call (each event's ``SerializeToString()``), for tooltrail's ``TurnWorkflow`` and for the
raw floor (``BenchFloorWorkflow``: one plain activity per call; started eagerly, as tooltrail
starts a turn). Flat columns mean a turn's cost is linear in its calls.
Run: ``python -m bench.scale``.
"""

from __future__ import annotations

import asyncio
import uuid

from temporalio.worker import Worker

from bench.common import embedded, history_size, median, report, timed
from bench.floor import FloorWorkflow, noop
from tooltrail import Host, ToolCall, tool

SIZES = (1, 10, 100, 500)
REPEAT = {1: 10, 10: 5, 100: 3, 500: 2}


@tool
async def nothing(text: str) -> str:
    """Return the text."""
    return text


async def main() -> None:
    rows = []
    async with embedded(Host([nothing])) as tt:
        floor_queue = f"floor-{uuid.uuid4()}"
        async with Worker(
            tt.client, task_queue=floor_queue, workflows=[FloorWorkflow], activities=[noop]
        ):
            await tt.run_turn([ToolCall("w", "nothing", {"text": "w"})], session_id="warm-up")
            for calls in SIZES:
                batch = [ToolCall(f"c{i}", "nothing", {"text": f"c{i}"}) for i in range(calls)]
                turn_ids: list[str] = []
                floor_ids: list[str] = []

                async def durable(batch: list[ToolCall] = batch, ids: list[str] = turn_ids) -> None:
                    turn = await tt.run_turn(batch, session_id=f"bench-{uuid.uuid4()}")
                    errors = [r for r in turn.results if r.is_error]
                    if len(turn.results) != len(batch) or errors:
                        raise RuntimeError(f"turn {turn.turn_id}: unexpected results {errors[:1]}")
                    ids.append(turn.turn_id)

                async def floor(calls: int = calls, ids: list[str] = floor_ids) -> None:
                    workflow_id = f"floor-{uuid.uuid4()}"
                    await tt.client.execute_workflow(
                        "BenchFloorWorkflow",
                        calls,
                        id=workflow_id,
                        task_queue=floor_queue,
                        request_eager_start=True,  # started as tooltrail starts a turn
                    )
                    ids.append(workflow_id)

                ms = median(await timed(durable, REPEAT[calls])) / calls
                floor_ms = median(await timed(floor, REPEAT[calls])) / calls
                events, size, _ = await history_size(tt.client, turn_ids[-1])
                floor_events, floor_size, _ = await history_size(tt.client, floor_ids[-1])
                rows.append(
                    [
                        f"{calls} calls/turn",
                        REPEAT[calls],
                        ms,
                        floor_ms,
                        ms / floor_ms,
                        events / calls,
                        floor_events / calls,
                        round(size / calls),
                        round(floor_size / calls),
                        size / floor_size,
                    ]
                )
    report(
        "scale",
        [
            "turn shape",
            "runs",
            "tooltrail ms/call",
            "floor ms/call",
            "ms ratio",
            "tooltrail events/call",
            "floor events/call",
            "tooltrail bytes/call",
            "floor bytes/call",
            "bytes ratio",
        ],
        rows,
        {"sizes": list(SIZES), "repeat": REPEAT},
    )


if __name__ == "__main__":
    asyncio.run(main())
