"""The audit database goes down in the middle of a turn and comes back.

The tools keep running while it is down (the audit batches written before each call, with
``audit_interval_s=0``, report that they were not written), the workflow sends the unwritten
records again with the next batch, and the final ``tooltrail.audit.record`` (a local
activity) retries until the database answers again. After recovery the audit trail must hold
every event exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import StackFactory
from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV
from tests.faults.history import activity_attempts, assert_exactly_once, require
from tests.faults.pg import ThrowawayPostgres
from tests.faults.workers import wait_until
from tooltrail import RunConfig, ToolCall
from tooltrail.core.wire import AUDIT_RECORD
from tooltrail.db.migrate import upgrade

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

CALLS = 6
BODY_S = 0.3
MIN_OUTAGE_S = 2.5
# Kept down past the last call's end (the final record follows), so its retry path runs too.
DOWN_AFTER_FINAL_RECORD_S = 1.0
MAX_OUTAGE_S = 20.0


@pytest.mark.postgres
async def test_turn_survives_a_database_outage(
    throwaway_pg: ThrowawayPostgres,
    stack: StackFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    caplog.set_level(logging.WARNING)
    url = throwaway_pg.url
    await upgrade(url)
    session_id = f"outage-{uuid.uuid4()}"
    calls = [ToolCall(f"c{i}", "slow", {"label": f"c{i}", "seconds": BODY_S}) for i in range(CALLS)]

    async with stack(fault_tools.host, database_url=url) as tt:
        handle = await tt.start_turn(
            calls, session_id=session_id, config=RunConfig(audit_interval_s=0)
        )
        turn_id = handle.turn_id

        async def first_calls_done() -> bool | None:
            ended = {r.label for r in fault_tools.runs("slow") if r.phase == "end"}
            return True if {"c0", "c1"} <= ended else None

        await wait_until(first_calls_done, timeout_s=60, what="the first two calls")
        await throwaway_pg.stop()
        down_since = time.monotonic()

        async def all_calls_done() -> bool | None:
            # The final record is a local activity: it leaves no trace in the history until
            # it completes, so wait for the last body instead; the record follows at once.
            ended = {r.label for r in fault_tools.runs("slow") if r.phase == "end"}
            return True if len(ended) == CALLS else None

        try:
            await wait_until(
                all_calls_done,
                timeout_s=MAX_OUTAGE_S,
                interval_s=0.1,
                what="the final audit record",
            )
            await asyncio.sleep(
                max(DOWN_AFTER_FINAL_RECORD_S, MIN_OUTAGE_S - (time.monotonic() - down_since))
            )
        finally:
            await throwaway_pg.start()
        outage_s = time.monotonic() - down_since

        turn = await asyncio.wait_for(handle.result(), timeout=60)
        events = await tt.audit(turn_id)
        record = await tt.store.turn(turn_id)
        memory = await tt.memory(session_id)
        history = await handle.workflow_handle.fetch_history()

    failed_flushes = [r for r in caplog.records if "audit write failed" in r.getMessage()]
    record_attempts = activity_attempts(history, AUDIT_RECORD)
    print(
        f"outage {outage_s:.1f} s; {len(failed_flushes)} audit batches could not be written; "
        f"final record completed on attempt {max(record_attempts, default=0)}; "
        f"{len(memory)}/{CALLS} memory entries"
    )
    # The turn completed with every result, in the model's order.
    assert [r.output for r in turn.results] == [f"c{i} done" for i in range(CALLS)]
    assert not any(r.is_error for r in turn.results)
    # Every tool body ran exactly once, outage or not.
    starts = [r.label for r in fault_tools.runs("slow") if r.phase == "start"]
    assert sorted(starts) == sorted(f"c{i}" for i in range(CALLS)), starts
    # The outage really hit both write paths: batches during the turn could not be written ...
    assert failed_flushes, f"no audit batch saw the outage ({outage_s:.1f} s down)"
    # ... and the final record was retried by Temporal until the database came back.
    assert record_attempts and max(record_attempts) > 1, record_attempts
    # Exactly once: contiguous seq 0..N-1 and the expected kinds per call, in order.
    assert_exactly_once(events, [call.id for call in calls])
    assert [e.payload["output"] for e in events if e.kind == "tool_post"] == [
        f"c{i} done" for i in range(CALLS)
    ]
    assert record is not None
    assert record.status == "completed"
    assert record.call_count == CALLS
    # Memory may lose entries to an outage, but never silently.
    if len(memory) != CALLS:
        assert any("memory store failed" in r.getMessage() for r in caplog.records), memory


@pytest.mark.postgres
async def test_idempotent_body_spanning_an_outage_runs_once(
    throwaway_pg: ThrowawayPostgres,
    stack: StackFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    url = throwaway_pg.url
    await upgrade(url)
    order = f"order-{uuid.uuid4()}"
    body_s = 2.0

    async with stack(fault_tools.host, database_url=url) as tt:
        handle = await tt.start_turn(
            [ToolCall("c0", "pay", {"order": order, "seconds": body_s})],
            session_id=f"outage-{uuid.uuid4()}",
        )

        async def body_started() -> bool | None:
            return True if fault_tools.runs("pay") else None

        await wait_until(body_started, timeout_s=60, what="the body")
        await throwaway_pg.stop()
        try:
            # Down past the body's end (and the outcome's commit tries), then back.
            await asyncio.sleep(body_s + 1.0)
            ended_during_outage = any(r.phase == "end" for r in fault_tools.runs("pay"))
        finally:
            await throwaway_pg.start()
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)

    body_runs = [
        (r.phase, round(r.at - fault_tools.runs("pay")[0].at, 2)) for r in fault_tools.runs("pay")
    ]
    print(f"body ended during the outage: {ended_during_outage}; runs (s from first) {body_runs}")
    require(ended_during_outage, "the body did not end while the database was down")
    outputs = [r.output for r in turn.results]
    require(outputs == [f"paid {order}"], f"unexpected results {outputs}")
    try:
        assert_exactly_once(events, ["c0"])
    except AssertionError as exc:
        pytest.fail(f"audit trail: {exc}")
    require(record is not None and record.status == "completed", f"turn row {record}")
    # An outcome that cannot be committed during the outage must not cost a second run of the
    # body (it once did: the retry took the key over when the owner's lease lapsed).
    starts = [r for r in fault_tools.runs("pay") if r.phase == "start"]
    assert len(starts) == 1, f"the idempotent body ran {len(starts)} times: {body_runs}"
