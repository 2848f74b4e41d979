"""A database that hangs (a table lock held) does not hold the turn's tools (issue 22, 10/13).

The audit batches written during the turn are best effort with a short deadline, and after
one failed or hung the worker pauses them (``Recorder``, ``BATCH_DEADLINE_S`` and
``BATCH_PAUSE_S`` in ``tooltrail/activities/tool_execution.py``): while ``audit_event`` is
locked a turn of many sequential calls goes on, paying one deadline per pause, not one per
batch; the records wait, and the final write lands once the lock is gone, with every event
exactly once and the hash chain whole.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import StackFactory
from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV
from tests.faults.history import assert_exactly_once
from tests.faults.pg import ThrowawayPostgres
from tests.faults.workers import wait_until
from tooltrail import RunConfig, ToolCall
from tooltrail.db.migrate import upgrade

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

CALLS = 24
LOCK_S = 25.0
"""With one 5 s deadline per batch (before the pause) the 23 calls under the lock would take
over 115 s; with the pause they take a few deadlines and their bodies."""


@pytest.mark.postgres
async def test_tools_go_on_while_the_audit_table_is_locked(
    throwaway_pg: ThrowawayPostgres,
    stack: StackFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    url = throwaway_pg.url
    await upgrade(url)
    calls = [ToolCall(f"c{i}", "slow", {"label": f"c{i}", "seconds": 0.2}) for i in range(CALLS)]
    started = time.monotonic()
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")

    async with stack(fault_tools.host, database_url=url) as tt:
        handle = await tt.start_turn(
            calls,
            session_id=f"hang-{uuid.uuid4()}",
            config=RunConfig(audit_interval_s=0),  # a batch before every call
        )

        async def first_done() -> bool | None:
            ended = {r.label for r in fault_tools.runs("slow") if r.phase == "end"}
            return True if "c0" in ended else None

        await wait_until(first_done, timeout_s=60, what="the first call")
        locker = await asyncpg.connect(dsn)
        try:
            transaction = locker.transaction()
            await transaction.start()
            await locker.execute("LOCK TABLE audit_event IN ACCESS EXCLUSIVE MODE")
            locked_at = time.monotonic()

            async def all_done() -> bool | None:
                ended = {r.label for r in fault_tools.runs("slow") if r.phase == "end"}
                return True if len(ended) == CALLS else None

            await wait_until(all_done, timeout_s=LOCK_S, what="the other calls, under the lock")
            bodies_done_s = time.monotonic() - locked_at
            await asyncio.sleep(max(0.0, LOCK_S - (time.monotonic() - locked_at)))
            released_at = time.time()
            await transaction.rollback()
        finally:
            await locker.close()
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        turn_s = time.monotonic() - started
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)
        report = await tt.verify(turn.turn_id)

    print(
        f"the other {CALLS - 1} calls ran in {bodies_done_s:.1f} s under a {LOCK_S:.0f} s lock;"
        f" the turn took {turn_s:.1f} s"
    )
    # The tools went on under the lock: every body ended (by its own clock) before the lock
    # was released, and far sooner than one deadline per batch would allow.
    ends = [r.at for r in fault_tools.runs("slow") if r.phase == "end"]
    assert len(ends) == CALLS and max(ends) < released_at
    assert bodies_done_s < LOCK_S - 5
    assert [r.output for r in turn.results] == [f"c{i} done" for i in range(CALLS)]
    assert_exactly_once(events, [call.id for call in calls])
    assert record is not None and record.status == "completed"
    assert report.ok, report
