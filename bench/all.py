"""Every benchmark in one run: overhead, parallel, scale, throughput, audit, memory, peer.

Run: ``python -m bench.all`` (``make bench``), or ``python -m bench.all scale audit`` for
some of them. Each prints its table and writes ``bench/results/<name>.json``; one that fails
is reported and the others still run (exit status 1 if any failed).
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Awaitable, Callable

from bench import audit, memory, overhead, parallel, peer, scale, throughput
from bench.common import console

BENCHMARKS: dict[str, Callable[[], Awaitable[None]]] = {
    "overhead": overhead.main,
    "parallel": parallel.main,
    "scale": scale.main,
    "throughput": throughput.main,
    "audit": audit.main,
    "memory": memory.main,
    "peer": peer.main,
}


async def main(names: list[str] | None = None) -> list[str]:
    """Run the named benchmarks (all by default) in order; return the names that failed."""
    failed = []
    for name in names or list(BENCHMARKS):
        console.rule(f"bench.{name}")
        started = time.perf_counter()
        try:
            await BENCHMARKS[name]()
        except Exception:
            failed.append(name)
            console.print(f"bench.{name} failed:", style="red")
            console.print(traceback.format_exc(), markup=False, highlight=False)
        console.print(f"bench.{name}: {time.perf_counter() - started:.1f} s")
    return failed


if __name__ == "__main__":
    wanted = sys.argv[1:]
    unknown = [name for name in wanted if name not in BENCHMARKS]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    failures = asyncio.run(main(wanted or None))
    if failures:
        sys.exit(f"failed: {', '.join(failures)}")
