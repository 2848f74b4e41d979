"""Shared pieces of the benchmarks: one embedded stack per run, tables, JSON results."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

import tooltrail
from tooltrail import Host, Tooltrail
from tooltrail.runtime.embedded import DEV_SERVER_ARGS

RESULTS = Path(__file__).resolve().parent / "results"
# Rich falls back to 80 columns when stdout is not a terminal (make, CI, a pipe): wide tables
# then wrap every cell. Take 160 there unless COLUMNS says otherwise.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


@contextlib.asynccontextmanager
async def embedded(
    host: Host, server_args: Sequence[str] = DEV_SERVER_ARGS
) -> AsyncIterator[Tooltrail]:
    """The embedded dev server (with tooltrail's settings), a worker and a fresh SQLite file."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        async with tooltrail.local(host, database_url=url, server_args=server_args) as tt:
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


class HistorySize(NamedTuple):
    """The size of one or more workflow histories."""

    events: int
    size: int
    """Sum of ``len(event.SerializeToString())``."""
    activities: int
    """Activities scheduled (``ACTIVITY_TASK_SCHEDULED`` events)."""


async def history_size(
    client: Client, workflow_id: str, *, follow_continue_as_new: bool = True
) -> HistorySize:
    """Return the size of a workflow's history.

    With ``follow_continue_as_new``, the runs before a continue-as-new are counted too.
    """
    events = size = activities = 0
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events += len(history.events)
        size += sum(len(e.SerializeToString()) for e in history.events)
        activities += sum(
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED for e in history.events
        )
        started = history.events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id or None
        if not follow_continue_as_new or run_id is None:
            return HistorySize(events, size, activities)


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
