"""A failed audit write never carries the data it was writing into Temporal.

The audit database refuses writes with a trigger: on SQLite with a fixed message (SQLAlchemy
would list the statement's parameters), on PostgreSQL quoting the row (as a driver or a
constraint may). Both on a throwaway database of the test's own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.conftest import scratch_postgres_database
from tooltrail import Host, tool
from tooltrail.activities import AuditActivities
from tooltrail.activities.tool_execution import Recorder
from tooltrail.core.wire import AUDIT_RECORD, AuditEvent, Flush, RecordTurn
from tooltrail.db.engine import normalize_url
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.runtime.clean_failures import clean_database_error
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

SECRET = f"card-{uuid.uuid4().hex}"

REFUSE = {
    "sqlite": [
        "CREATE TRIGGER tt_refuse BEFORE INSERT ON audit_event "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION tt_refuse() RETURNS trigger AS $$ BEGIN "
        "RAISE EXCEPTION 'refused: %', NEW.payload::text; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER tt_refuse BEFORE INSERT ON audit_event "
        "FOR EACH ROW EXECUTE FUNCTION tt_refuse()",
    ],
}


async def refuse_inserts(url: str) -> str:
    """Migrate ``url`` and make its ``audit_event`` refuse every insert."""
    await upgrade(url)
    backend = "sqlite" if url.startswith("sqlite") else "postgresql"
    engine = create_async_engine(normalize_url(url))
    async with engine.begin() as conn:
        for statement in REFUSE[backend]:
            await conn.execute(text(statement))
    await engine.dispose()
    return url


@pytest.fixture
async def refusing_sqlite(tmp_path: Path) -> str:
    return await refuse_inserts(f"sqlite:///{tmp_path / 'refusing.db'}")


@pytest.fixture
async def refusing_postgres(postgres_server_url: str) -> AsyncIterator[str]:
    # A database of the test's own: the trigger must not reach the session's database
    # (``postgres_server_url`` skips the test when no server answers).
    async with scratch_postgres_database("tooltrail_refuse") as url:
        yield await refuse_inserts(url)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def refusing_url(request: pytest.FixtureRequest) -> str:
    """A migrated audit database whose ``audit_event`` refuses every insert."""
    name = "refusing_sqlite" if request.param == "sqlite" else "refusing_postgres"
    return str(request.getfixturevalue(name))


def secret_flush() -> Flush:
    return Flush(
        turn_id=f"turn-{uuid.uuid4()}",
        session_id="s",
        events=[
            AuditEvent(
                seq=0,
                kind="tool_call_received",
                tool_call_id="c1",
                tool_name="charge",
                payload={"input": {"card": SECRET}},
                created_at=datetime.now(UTC),
            )
        ],
    )


async def test_a_refused_write_names_no_parameter_and_its_clean_form_no_value(
    refusing_url: str,
) -> None:
    store = AuditStore(refusing_url)
    try:
        with pytest.raises(SQLAlchemyError) as caught:
            await store.write_flush(secret_flush())
    finally:
        await store.close()
    error = caught.value
    text_ = str(error)
    assert "SQL parameters hidden" in text_  # the engine lists none
    if refusing_url.startswith("postgresql"):
        # The database itself quotes the row: only the activity boundary can stop that.
        assert SECRET in text_
    else:
        assert SECRET not in text_
    clean = clean_database_error(error, where="tooltrail.audit.record")
    assert clean is not None
    assert SECRET not in str(clean) and "[SQL" not in clean.message
    assert clean.message.startswith("database error in tooltrail.audit.record: ")


async def test_an_engine_that_lists_parameters_would_leak_them(refusing_url: str) -> None:
    # The control for the test above: SQLAlchemy's default puts the row in the message.
    engine = create_async_engine(normalize_url(refusing_url))
    try:
        async with engine.begin() as conn:
            with pytest.raises(Exception, match=SECRET):
                await conn.execute(
                    text(
                        "INSERT INTO audit_event (turn_id, run_id, seq, kind, payload, "
                        "created_at) VALUES (:t, '', 0, 'x', :p, :c)"
                    ),
                    {"t": "t", "p": f'{{"card": "{SECRET}"}}', "c": datetime.now(UTC)},
                )
    finally:
        await engine.dispose()


def test_only_database_errors_are_replaced_and_verdicts_are_kept() -> None:
    assert clean_database_error(ValueError(SECRET), where="a") is None
    assert clean_database_error(ApplicationError(SECRET, type="Mine"), where="a") is None
    import sqlite3

    try:
        try:
            raise sqlite3.IntegrityError(f"UNIQUE constraint failed: {SECRET}")
        except sqlite3.Error as inner:
            raise ApplicationError(f"wrapped: {inner}", type="Final", non_retryable=True) from inner
    except ApplicationError as outer:
        clean = clean_database_error(outer, where="tooltrail.tool.execute")
    assert clean is not None
    assert (clean.type, clean.non_retryable) == ("Final", True)
    assert SECRET not in str(clean) and "IntegrityError" in str(clean)


@workflow.defn(sandboxed=False)
class RecordOnce:
    """Runs the audit activity once, on another queue, and returns its failure's text."""

    @workflow.run
    async def run(self, task_queue: str, flush: Flush) -> str:
        try:
            await workflow.execute_activity(
                AUDIT_RECORD,
                RecordTurn(flush=flush, must_persist=True),
                task_queue=task_queue,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as failure:
            cause = failure.cause
            return cause.message if isinstance(cause, ApplicationError) else str(cause)
        return "written"


@tool
def nothing() -> str:
    """Do nothing."""
    return ""


WorkerFactory = Callable[[Client, AuditStore, str], Worker]


async def record_once(client: Client, make_worker: WorkerFactory, url: str) -> tuple[str, bytes]:
    activity_queue = f"tq-audit-{uuid.uuid4()}"
    workflow_queue = f"tq-record-{uuid.uuid4()}"
    store = AuditStore(url)
    try:
        async with (
            make_worker(client, store, activity_queue),
            Worker(
                client,
                task_queue=workflow_queue,
                workflows=[RecordOnce],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
        ):
            handle = await client.start_workflow(
                RecordOnce.run,
                args=[activity_queue, secret_flush()],
                id=f"record-{uuid.uuid4()}",
                task_queue=workflow_queue,
            )
            said = await handle.result()
            history = await handle.fetch_history()
    finally:
        await store.close()
    # The activity's input holds the secret (no codec here); its failure must not.
    [failed] = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    ]
    return said, failed.activity_task_failed_event_attributes.failure.SerializeToString()


@pytest.mark.parametrize("worker", ["tooltrail", "plain"])
async def test_the_audit_activity_fails_without_the_data_it_was_writing(
    temporal_env: WorkflowEnvironment, refusing_url: str, tmp_path: Path, worker: str
) -> None:
    def tooltrail_worker(client: Client, store: AuditStore, queue: str) -> Worker:
        return build_worker(
            client, Host([nothing]), task_queue=queue, store=store, scratch=ScratchDirs(tmp_path)
        )

    def plain_worker(client: Client, store: AuditStore, queue: str) -> Worker:
        # The control: tooltrail's audit activity on a worker without its interceptor.
        activities = AuditActivities(Recorder(store))
        return Worker(client, task_queue=queue, activities=[activities.record])

    factory = tooltrail_worker if worker == "tooltrail" else plain_worker
    said, failure = await record_once(temporal_env.client, factory, refusing_url)
    if worker == "tooltrail":
        assert said.startswith(f"database error in {AUDIT_RECORD}: "), said
        assert SECRET not in said
        assert SECRET.encode() not in failure
    else:
        # The engine hides parameters (SQLite's case), but PostgreSQL's own message quotes
        # the row: without the interceptor it is in the history.
        leaked = SECRET.encode() in failure
        assert leaked == refusing_url.startswith("postgresql"), said
