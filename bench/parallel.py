"""8 concurrency-safe tools of 200 ms in one turn: parallel vs sequential vs the ideal 200 ms.

Run: ``python -m bench.parallel`` (or ``make bench``). Ratios come from one run on one
machine, side by side.
"""

from __future__ import annotations

import asyncio
import uuid

from bench.common import embedded, median, report, timed
from tooltrail import Host, RunConfig, ToolCall, tool

CALLS = 8
DURATION_MS = 200
REPEAT = 5


@tool(concurrent_safe=True)
async def work(n: int) -> str:
    """Take 200 ms."""
    await asyncio.sleep(DURATION_MS / 1000)
    return f"done {n}"


async def main() -> None:
    calls = [ToolCall(f"c{i}", "work", {"n": i}) for i in range(CALLS)]
    async with embedded(Host([work])) as tt:
        await tt.run_turn(calls[:1], session_id="warm-up")
        results = {}
        for mode in ("parallel", "sequential"):
            config = RunConfig(dispatch=mode, max_concurrency=CALLS)  # type: ignore[arg-type]

            async def one_turn(config: RunConfig = config) -> None:
                await tt.run_turn(calls, session_id=f"bench-{uuid.uuid4()}", config=config)

            results[mode] = median(await timed(one_turn, REPEAT))
    ideal = float(DURATION_MS)
    rows = [
        ["ideal (one tool's time)", ideal, 1.0, ideal / CALLS],
        ["parallel", results["parallel"], results["parallel"] / ideal, results["parallel"] / CALLS],
        [
            "sequential",
            results["sequential"],
            results["sequential"] / ideal,
            results["sequential"] / CALLS,
        ],
    ]
    report(
        "parallel",
        ["mode", "turn ms (median)", "x ideal", "ms per call"],
        rows,
        {"calls": CALLS, "tool_ms": DURATION_MS, "repeat": REPEAT},
    )
    print(f"speed-up parallel vs sequential: {results['sequential'] / results['parallel']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
