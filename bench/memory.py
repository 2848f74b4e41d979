"""Worker memory over many calls: RSS of the process running the worker, before and after.

A worker must keep nothing per call (no in-memory dispatch log, no per-turn caches that
only grow): after 5,000 calls (100 turns of 50 no-op calls, SQLite audit trail) its
resident set should be where warm-up left it. A figure, not a timed test.
Run: ``python -m bench.memory`` (or ``make bench``).
"""

from __future__ import annotations

import asyncio
import gc
import uuid

from bench.common import embedded, report
from tooltrail import Host, ToolCall, Tooltrail, tool

CALLS_PER_TURN = 50
TURNS = 100
WARM_UP_TURNS = 10


@tool
async def nothing(text: str) -> str:
    """Return the text."""
    return text


def rss_mib() -> float:
    """This process's resident set size, in MiB (Linux ``/proc``)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def turns(tt: Tooltrail, count: int) -> None:
    for _ in range(count):
        calls = [ToolCall(f"c{i}", "nothing", {"text": f"c{i}"}) for i in range(CALLS_PER_TURN)]
        await tt.run_turn(calls, session_id=f"mem-{uuid.uuid4()}")


async def main() -> None:
    async with embedded(Host([nothing])) as tt:
        await turns(tt, WARM_UP_TURNS)
        gc.collect()
        before = rss_mib()
        await turns(tt, TURNS)
        gc.collect()
        after = rss_mib()
    calls = TURNS * CALLS_PER_TURN
    report(
        "memory",
        ["calls", "RSS before (MiB)", "RSS after (MiB)", "growth (MiB)", "growth per call (KiB)"],
        [[calls, before, after, after - before, (after - before) * 1024 / calls]],
        {"calls_per_turn": CALLS_PER_TURN, "warm_up_turns": WARM_UP_TURNS},
    )


if __name__ == "__main__":
    asyncio.run(main())
