"""The idempotency lease is fenced (issue 22, finding 11).

An owner whose lease lapsed while its body ran (a worker paused past its lease: here the
lease is expired in the database, deterministically) is taken over by another execution with
the same call id (model call ids repeat across turns). The stale owner can neither renew nor
commit the new holder's claim: its own result is returned uncached and its trail says
``lease_lost=True``; the new holder's commit is the one stored.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.conftest import StackFactory
from tooltrail import Host, ToolCall, ToolContext, tool
from tooltrail.db.orm import IdempotencyRecordRow

pytestmark = pytest.mark.timeout(120)


def _dispatch_of(events: list[Any]) -> dict[str, Any]:
    [post] = [e for e in events if e.kind == "tool_post"]
    dispatch = post.payload["dispatch"]
    assert isinstance(dispatch, dict)
    return dispatch


async def test_stale_owner_cannot_commit_a_taken_over_claim(
    db_url: str, stack: StackFactory
) -> None:
    releases = [threading.Event(), threading.Event()]
    runs: list[str] = []

    @tool(idempotent=True)
    def charge_card(ctx: ToolContext, order: str) -> str:
        """Charge once per order."""
        mine = len(runs)
        runs.append(ctx.turn_id)
        releases[mine].wait(timeout=60)
        return f"charged {order} in run {mine}"

    order = f"order-{uuid.uuid4()}"
    call = ToolCall("call_0", "charge_card", {"order": order})
    async with stack(Host([charge_card]), database_url=db_url) as tt:
        async with tt.store.engine.connect() as conn:
            earlier = list((await conn.execute(select(IdempotencyRecordRow.key))).scalars())
        first = await tt.start_turn([call], session_id=f"a-{uuid.uuid4()}")

        async def started(n: int) -> None:
            deadline = time.monotonic() + 30
            while len(runs) < n:
                assert time.monotonic() < deadline, f"body {n} did not start"
                await asyncio.sleep(0.05)

        await started(1)
        # The first owner's worker "pauses" past its lease: the lease lapses.
        async with tt.store.engine.begin() as conn:
            # Only this test's claim: the PostgreSQL database is shared by the test session.
            (mine,) = (
                await conn.execute(
                    select(IdempotencyRecordRow.key).where(
                        IdempotencyRecordRow.key.not_in(earlier),
                        IdempotencyRecordRow.tool_name == "charge_card",
                    )
                )
            ).one()
            await conn.execute(
                update(IdempotencyRecordRow)
                .where(IdempotencyRecordRow.key == mine)
                .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=5))
            )
        # Another turn makes the same call (same call id, same arguments): it takes over.
        second = await tt.start_turn([call], session_id=f"b-{uuid.uuid4()}")
        await started(2)
        releases[0].set()  # the stale owner finishes first
        stale = await asyncio.wait_for(first.result(), timeout=60)
        releases[1].set()
        holder = await asyncio.wait_for(second.result(), timeout=60)
        stale_dispatch = _dispatch_of(await tt.audit(stale.turn_id))
        holder_dispatch = _dispatch_of(await tt.audit(holder.turn_id))
        async with tt.store.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(IdempotencyRecordRow).where(IdempotencyRecordRow.key == mine)
                )
            ).one()

    assert stale.results[0].output == f"charged {order} in run 0"
    assert (stale_dispatch["status"], stale_dispatch["lease_lost"]) == ("ok", True)
    assert holder.results[0].output == f"charged {order} in run 1"
    assert (holder_dispatch["status"], holder_dispatch["lease_lost"]) == ("ok", False)
    # What is stored is the holder's outcome, never the stale owner's.
    assert row.state == "succeeded"
    assert row.outcome["value"] == f"charged {order} in run 1"
