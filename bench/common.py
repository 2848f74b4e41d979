"""Shared pieces of the benchmarks: one embedded stack per run, tables, JSON results."""

from __future__ import annotations

import contextlib
import json
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import tooltrail
from tooltrail import Host, Tooltrail

RESULTS = Path(__file__).resolve().parent / "results"
console = Console()


@contextlib.asynccontextmanager
async def embedded(host: Host) -> AsyncIterator[Tooltrail]:
    """The embedded dev server (with tooltrail's settings), a worker and a fresh SQLite file."""
    with tempfile.TemporaryDirectory() as tmp:
        async with tooltrail.local(host, database_url=f"sqlite:///{tmp}/bench.db") as tt:
            yield tt


async def timed(fn: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    """Run ``fn`` ``repeat`` times; return the wall times in milliseconds."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def median(samples: list[float]) -> float:
    """The median, robust to the noise of a shared machine."""
    return statistics.median(samples)


def report(name: str, columns: list[str], rows: list[list[Any]], extra: dict[str, Any]) -> None:
    """Print a table and write ``bench/results/<name>.json``."""
    table = Table(title=name, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column != columns[0] else "left")
    for row in rows:
        table.add_row(*[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row])
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    data = {
        "benchmark": name,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "columns": columns,
        "rows": rows,
        **extra,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
