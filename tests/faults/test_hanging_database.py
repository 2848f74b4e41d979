"""A database that hangs (a table lock held) does not hold the turn's tools (issue 22, 10/13).

The audit batches written during the turn are best effort with a short deadline
(``workflows/trail.py`` ``_BATCH_DEADLINE``): while ``audit_event`` is locked the tools go on,
each batch costing the turn at most the deadline; the records wait, and the final write lands
once the lock is gone, with every event exactly once.
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

CALLS = 4
LOCK_S = 25.0


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
            await transaction.rollback()
        finally:
            await locker.close()
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)

    print(f"the other {CALLS - 1} calls ran in {bodies_done_s:.1f} s under a {LOCK_S:.0f} s lock")
    # The tools went on under the lock (each batch held its turn at most the deadline).
    assert bodies_done_s < LOCK_S - 5
    assert [r.output for r in turn.results] == [f"c{i} done" for i in range(CALLS)]
    assert_exactly_once(events, [call.id for call in calls])
    assert record is not None and record.status == "completed"
