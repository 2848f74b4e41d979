"""The access gate the workers run (GIA §6): the preflight asks a worker, and idempotency
records name the principal whose scope their key is in. On a real server."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tooltrail import (
    AccessConfig,
    AuthorityScope,
    Host,
    Idempotency,
    Principal,
    ToolCall,
    Tooltrail,
    UnknownToolError,
    tool,
)
from tooltrail.db.orm import IdempotencyRecordRow
from tooltrail.db.store import AuditStore
from tooltrail.runtime.worker import build_worker


@tool
def read_file(path: str) -> str:
    """Read."""
    return f"read {path}"


@tool
def admin_op() -> str:
    """Only for admins."""
    return "done"


@tool(idempotent=True)
def send_email(to: str) -> str:
    """Send once per principal and recipient."""
    return f"sent to {to}"


@tool(idempotent=Idempotency(scope="global"))
def publish(topic: str) -> str:
    """Publish once for everyone."""
    return f"published {topic}"


WORKER_ACCESS = AccessConfig(
    principal=Principal("svc-worker"),
    authority=AuthorityScope(allowed_tools={"read_*", "send_*", "publish"}),
)


async def test_the_preflight_is_answered_by_the_workers_gate(
    temporal_env: WorkflowEnvironment, sqlite_url: str
) -> None:
    # A connect() deployment: the workers wire identity; the client's Host has none, and
    # knows a tool the workers do not serve.
    worker_host = Host([read_file, admin_op], access=WORKER_ACCESS)
    client_host = Host([read_file, admin_op, send_email])
    store = AuditStore(sqlite_url)
    task_queue = f"tq-{uuid.uuid4()}"
    tt = Tooltrail(temporal_env.client, client_host, task_queue=task_queue, store=store)
    try:
        async with build_worker(
            temporal_env.client, worker_host, task_queue=task_queue, store=store
        ):
            allowed = await tt.authorize_tool("read_file", {"path": "/x"})
            denied = await tt.authorize_tool("admin_op")
            with pytest.raises(UnknownToolError):
                await tt.authorize_tool("send_email", {"to": "a@b"})
            # What dispatch does agrees with the preflight.
            turn = await tt.run_turn(
                [ToolCall("a", "read_file", {"path": "/x"}), ToolCall("b", "admin_op", {})],
                session_id="pre-1",
                advertised=["read_file", "admin_op"],
            )
    finally:
        await store.close()
    assert (allowed.allowed, denied.allowed) == (True, False)
    assert denied.error_text == (
        "access denied: tool 'admin_op' is outside the authority of principal 'svc-worker'"
    )
    assert [r.is_error for r in turn.results] == [False, True]
    assert turn.results[1].output == denied.error_text


async def test_idempotency_records_name_their_scope_principal(
    stack: StackFactory, db_url: str
) -> None:
    host = Host([send_email, publish], access=WORKER_ACCESS)
    to, topic = f"{uuid.uuid4().hex[:8]}@example.com", f"t-{uuid.uuid4().hex[:8]}"
    async with stack(host, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("s", "send_email", {"to": to}), ToolCall("p", "publish", {"topic": topic})],
            session_id="scope-1",
        )
        events = await tt.audit(turn.turn_id)
        keys = {
            e.tool_call_id: e.payload["dispatch"]["idempotency_key"]
            for e in events
            if e.kind == "tool_post"
        }
        async with tt.store.sessions() as session:
            rows = dict(
                (
                    await session.execute(
                        select(
                            IdempotencyRecordRow.key, IdempotencyRecordRow.scope_principal
                        ).where(IdempotencyRecordRow.key.in_(list(keys.values())))
                    )
                ).all()
            )
    assert [r.output for r in turn.results] == [f"sent to {to}", f"published {topic}"]
    assert rows == {keys["s"]: "svc-worker", keys["p"]: None}
