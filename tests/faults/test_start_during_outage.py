"""A turn starts and runs while the audit database is down (issue 22, finding 10).

Its plan cannot read the session's state: the turn starts without it (an empty loop window),
its tools run while the database is down, its records wait, and the final write lands once
the database is back. The state it saves never replaces the session's stored one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import StackFactory
from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV
from tests.faults.history import assert_exactly_once
from tests.faults.pg import ThrowawayPostgres
from tests.faults.workers import wait_until
from tooltrail import ToolCall
from tooltrail.db.migrate import upgrade

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

CALLS = 3


@pytest.mark.postgres
async def test_turn_starts_and_runs_while_the_database_is_down(
    throwaway_pg: ThrowawayPostgres,
    stack: StackFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    url = throwaway_pg.url
    await upgrade(url)
    session_id = f"down-{uuid.uuid4()}"

    def calls(prefix: str) -> list[ToolCall]:
        return [
            ToolCall(f"{prefix}{i}", "slow", {"label": f"{prefix}{i}", "seconds": 0.2})
            for i in range(CALLS)
        ]

    async with stack(fault_tools.host, database_url=url) as tt:
        before = await tt.run_turn(calls("a"), session_id=session_id)
        stored = await tt.store.session_state(session_id)
        assert stored.version == 1 and stored.detector.model_dump() != {}

        await throwaway_pg.stop()
        try:
            handle = await tt.start_turn(calls("b"), session_id=session_id)

            async def bodies_done() -> bool | None:
                ended = {r.label for r in fault_tools.runs("slow") if r.phase == "end"}
                return True if {f"b{i}" for i in range(CALLS)} <= ended else None

            started = time.monotonic()
            await wait_until(bodies_done, timeout_s=60, what="the turn's tools, database down")
            ran_in_s = time.monotonic() - started
            # Down a little longer: the final write must wait for the database.
            await asyncio.sleep(1.0)
            assert not await _done(handle)
        finally:
            await throwaway_pg.start()
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)
        after = await tt.store.session_state(session_id)

    print(f"the turn's {CALLS} tools ran in {ran_in_s:.1f} s with the database down")
    assert [r.output for r in before.results] == [f"a{i} done" for i in range(CALLS)]
    assert [r.output for r in turn.results] == [f"b{i} done" for i in range(CALLS)]
    assert_exactly_once(events, [f"b{i}" for i in range(CALLS)])
    assert record is not None and record.status == "completed"
    # The session's stored state is the one the first turn left, never the fresh one.
    assert after.model_dump() == stored.model_dump()


async def _done(handle: object) -> bool:
    described = await handle.workflow_handle.describe()  # type: ignore[attr-defined]
    return described.close_time is not None
