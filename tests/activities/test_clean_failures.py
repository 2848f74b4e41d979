"""A failed audit write never carries the data it was writing into Temporal.

The audit database refuses writes with a trigger: on SQLite with a fixed message (SQLAlchemy
would list the statement's parameters), on PostgreSQL quoting the row (as a driver or a
constraint may). Both on a throwaway database of the test's own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
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
from temporalio.worker import Interceptor, UnsandboxedWorkflowRunner, Worker

from tests.conftest import scratch_postgres_database
from tooltrail.activities import AuditActivities
from tooltrail.activities.tool_execution import Recorder
from tooltrail.core.wire import AUDIT_RECORD, AuditEvent, Flush, RecordTurn
from tooltrail.db.engine import normalize_url
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.runtime.clean_failures import CleanDatabaseErrors, clean_database_error

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
    """Runs the audit activity once (a local activity, as every tooltrail workflow does:
    the activity refuses a regular task) and returns its failure's text."""

    @workflow.run
    async def run(self, flush: Flush) -> str:
        try:
            await workflow.execute_local_activity(
                AUDIT_RECORD,
                RecordTurn(flush=flush, must_persist=True),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except (ActivityError, ApplicationError) as failure:
            # A local activity's failure arrives as the activity's own error.
            cause = failure.cause if isinstance(failure, ActivityError) else failure
            return cause.message if isinstance(cause, ApplicationError) else str(cause)
        return "written"


async def record_once(
    client: Client, interceptors: list[Interceptor], url: str
) -> tuple[str, bytes]:
    queue = f"tq-record-{uuid.uuid4()}"
    store = AuditStore(url)
    try:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[RecordOnce],
            activities=[AuditActivities(Recorder(store)).record],
            interceptors=interceptors,
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await client.start_workflow(
                RecordOnce.run,
                args=[secret_flush()],
                id=f"record-{uuid.uuid4()}",
                task_queue=queue,
            )
            said = await handle.result()
            history = await handle.fetch_history()
    finally:
        await store.close()
    # The local activity's failure is in its marker; it must not hold the secret.
    [failed] = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    return said, failed.SerializeToString()


@pytest.mark.parametrize("worker", ["tooltrail", "plain"])
async def test_the_audit_activity_fails_without_the_data_it_was_writing(
    temporal_env: WorkflowEnvironment, refusing_url: str, worker: str
) -> None:
    # tooltrail's workers install CleanDatabaseErrors first (build_worker); "plain" is the
    # control without it.
    interceptors: list[Interceptor] = [CleanDatabaseErrors()] if worker == "tooltrail" else []
    said, failure = await record_once(temporal_env.client, interceptors, refusing_url)
    if worker == "tooltrail":
        assert said.startswith(f"database error in {AUDIT_RECORD}: "), said
        assert SECRET not in said
        assert SECRET.encode() not in failure
    else:
        # The engine hides parameters (SQLite's case), but PostgreSQL's own message quotes
        # the row: without the interceptor it is in the history.
        leaked = SECRET.encode() in failure
        assert leaked == refusing_url.startswith("postgresql"), said
