"""Audit trail write rate: ``AuditStore.write_flush`` with 1, 10 and 100 events per flush.

A flush is what one activity writes: the turn row (insert-or-ignore) and a batch of events
in one transaction. Each turn takes 100 events (``seq`` 0..99), in flushes of the batch
size, one flush after the other (one writer, as one activity at a time of one turn); the last
row has 8 writers at once (8 turns in flight). Payloads look like a no-op call's
``tool_call_received``/``tool_pre``/``tool_post`` events.

SQLite: a fresh file in a temporary directory (WAL, ``synchronous=NORMAL``, as tooltrail
configures it). PostgreSQL: a throwaway database ``bench_<uuid>`` created on the server of
``TOOLTRAIL_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``),
migrated, and dropped at the end; skipped with the reason when that server does not answer.
Run: ``python -m bench.audit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from bench.common import console, report
from tooltrail.core.wire import AuditEvent, Flush, TurnRecord
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore

ADMIN_URL = os.environ.get(
    "TOOLTRAIL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
EVENTS_PER_TURN = 100
# (events per flush, writers, flushes per writer)
SHAPES = [(1, 1, 1000), (10, 1, 300), (100, 1, 100), (10, 8, 60)]
KINDS = ("tool_call_received", "tool_pre", "tool_post")


def event(seq: int, now: datetime) -> AuditEvent:
    """One realistic event of a no-op call."""
    call = seq // len(KINDS)
    kind = KINDS[seq % len(KINDS)]
    payload: dict[str, Any] = {"tool": "nothing", "call_id": f"c{call}"}
    if kind == "tool_call_received":
        payload["input"] = {"text": f"c{call}"}
    elif kind == "tool_pre":
        payload.update(attempt=0, arguments={"text": f"c{call}"})
    else:
        payload.update(output=f"c{call}", is_error=False, duration_ms=0.05, attempt=0)
    return AuditEvent(
        seq=seq,
        kind=kind,
        tool_call_id=f"c{call}",
        tool_name="nothing",
        attempt=0 if kind != "tool_call_received" else None,
        payload=payload,
        created_at=now,
    )


def flushes(batch: int, count: int) -> list[Flush]:
    """``count`` flushes of ``batch`` events; a new turn every ``EVENTS_PER_TURN`` events."""
    now = datetime.now(UTC)
    out = []
    turn: TurnRecord | None = None
    seq = EVENTS_PER_TURN
    for _ in range(count):
        if seq >= EVENTS_PER_TURN:
            turn = TurnRecord(
                turn_id=f"turn-{uuid.uuid4()}", session_id=f"bench-{uuid.uuid4()}", started_at=now
            )
            seq = 0
        assert turn is not None
        out.append(
            Flush(
                turn_id=turn.turn_id,
                session_id=turn.session_id,
                turn=turn,
                events=[event(seq + i, now) for i in range(batch)],
            )
        )
        seq += batch
    return out


async def measure(url: str) -> list[tuple[float, float]]:
    """Per shape: (events per second, ms per flush)."""
    store = AuditStore(url)
    try:
        for flush in flushes(10, 20):  # connections, statement caches
            await store.write_flush(flush)
        results = []
        for batch, writers, count in SHAPES:
            work = [flushes(batch, count) for _ in range(writers)]

            async def writer(items: list[Flush]) -> None:
                for flush in items:
                    await store.write_flush(flush)

            started = time.perf_counter()
            await asyncio.gather(*(writer(items) for items in work))
            elapsed = time.perf_counter() - started
            total_flushes = writers * count
            results.append((total_flushes * batch / elapsed, elapsed * 1000 / total_flushes))
        return results
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def throwaway_postgres() -> AsyncIterator[str]:
    """A fresh, migrated database on the admin URL's server; dropped on exit."""
    admin = make_url(ADMIN_URL)
    name = f"bench_{uuid.uuid4().hex}"
    plain = admin.set(drivername="postgresql")
    conn = await asyncpg.connect(plain.render_as_string(hide_password=False), timeout=5)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
        url = plain.set(database=name).render_as_string(hide_password=False)
        try:
            await upgrade(url)
            yield url
        finally:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def main() -> None:
    columns: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/audit.db"
        await upgrade(url)
        columns["SQLite"] = await measure(url)
    skipped = None
    try:
        async with throwaway_postgres() as url:
            columns["PostgreSQL"] = await measure(url)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        shown = make_url(ADMIN_URL).render_as_string(hide_password=True)
        skipped = f"PostgreSQL skipped: no usable server at {shown} ({type(exc).__name__}: {exc})"
        console.print(skipped, style="yellow", markup=False)
    names = list(columns)
    header = ["events/flush x writers"]
    for name in names:
        header += [f"{name} events/s", f"{name} ms/flush"]
    if len(names) == 2:
        header.append("SQLite / PostgreSQL events/s")
    rows = []
    for i, (batch, writers, _count) in enumerate(SHAPES):
        row: list[Any] = [f"{batch} x {writers}"]
        for name in names:
            rate, per_flush = columns[name][i]
            row += [round(rate), per_flush]
        if len(names) == 2:
            row.append(columns["SQLite"][i][0] / columns["PostgreSQL"][i][0])
        rows.append(row)
    report(
        "audit",
        header,
        rows,
        {
            "shapes": [
                {"events_per_flush": b, "writers": w, "flushes_per_writer": c} for b, w, c in SHAPES
            ],
            "postgres_skipped": skipped,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
