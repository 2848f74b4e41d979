"""A body that returned is never run again because of tooltrail's own failure (issue 22, 2).

The audit database goes down while a non-idempotent tool's body runs; the body returns
300 KB, which the attempt must store in the database (a large output) before it can answer.
The attempt holds the result (journaled in its heartbeat details) and retries the write
until the database is back: the body ran once, and the call completes with its output.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import StackFactory
from tests.faults import fault_tools
from tests.faults.fault_tools import BIG_OUTPUT_CHARS, FAULT_DIR_ENV
from tests.faults.pg import ThrowawayPostgres
from tests.faults.workers import wait_until
from tooltrail import ToolCall
from tooltrail.db.migrate import upgrade

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

BODY_S = 1.0
DOWN_AFTER_BODY_S = 4.0


@pytest.mark.postgres
async def test_large_output_written_after_an_outage_runs_the_body_once(
    throwaway_pg: ThrowawayPostgres,
    stack: StackFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    url = throwaway_pg.url
    await upgrade(url)
    label = f"big-{uuid.uuid4().hex[:8]}"

    async with stack(fault_tools.host, database_url=url) as tt:
        handle = await tt.start_turn(
            [ToolCall("c0", "big", {"label": label, "seconds": BODY_S})],
            session_id=f"outage-{uuid.uuid4()}",
        )

        async def body_started() -> bool | None:
            return True if fault_tools.runs("big") else None

        await wait_until(body_started, timeout_s=60, what="the body")
        await throwaway_pg.stop()
        down_since = time.monotonic()
        try:

            async def body_ended() -> bool | None:
                return True if any(r.phase == "end" for r in fault_tools.runs("big")) else None

            await wait_until(body_ended, timeout_s=30, interval_s=0.05, what="the body's end")
            ended_while_down = True
            # Down well past the body's end: the large output cannot be stored meanwhile.
            await asyncio.sleep(DOWN_AFTER_BODY_S)
        finally:
            await throwaway_pg.start()
        outage_s = time.monotonic() - down_since
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        record = await tt.store.turn(turn.turn_id)

    starts = [r for r in fault_tools.runs("big") if r.phase == "start"]
    print(f"outage {outage_s:.1f} s; body starts: {len(starts)}")
    assert ended_while_down
    # The body ran once, though what it returned could not be written for seconds.
    assert len(starts) == 1, starts
    # The call completed with the whole output (read back from the database).
    [result] = turn.results
    assert not result.is_error, result.output
    assert isinstance(result.output, str)
    assert len(result.output) == BIG_OUTPUT_CHARS
    assert result.output.startswith(label)
    assert record is not None
    assert record.status == "completed"
