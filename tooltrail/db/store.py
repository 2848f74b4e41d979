"""Reads and idempotent writes of the audit trail and memory.

Every audit write is keyed on (turn id, Temporal run id, seq), never on an attempt number,
because Temporal may run an activity again: a second write of the same records is a no-op.
A reset (or any new run of the turn's workflow id) writes its own branch: nothing of an
earlier run is dropped or overwritten, and the turn's row follows the latest run. ORM rows
never leave this module; callers get pydantic models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, and_, bindparam, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tooltrail.core.chain import GENESIS, chain_digests, verify_chain
from tooltrail.core.detection import Operation
from tooltrail.core.messages import Message, ModelResponse, Usage
from tooltrail.core.wire import AuditEvent, Flush, MemoryEntry, SessionState, TurnRecord, TurnRun
from tooltrail.db.encoding import fits
from tooltrail.db.engine import create_engine, session_factory
from tooltrail.db.orm import (
    AuditEventRow,
    BlobRow,
    ConversationMessageRow,
    MemoryEntryRow,
    SessionStateRow,
    TurnRow,
    TurnRunRow,
)
from tooltrail.db.sqlite_guard import release_sqlite_file

__all__ = [
    "AuditStore",
    "TurnSummary",
    "list_events",
    "list_memory",
    "list_turns",
    "record_events",
    "record_memory",
    "record_turn",
]

log = logging.getLogger("tooltrail.db")

_NAME_COLUMNS = ("tool_call_id", "tool_name")
_NAME_LENGTH = 255
_ORIGINALS = "$tt:columns"
"""Payload key of the call id and tool name an event's columns could not hold as they are."""


_STATEMENTS: dict[tuple[str, str], Any] = {}


def _prepared(session: AsyncSession, name: str, build: Callable[[Any], Any]) -> Any:
    """A statement built once per dialect (``build`` gets the dialect's ``insert``).

    The audit writes run for every turn on its critical path: building a statement and its
    cache key each time cost more CPU than executing it. Values always come as parameters.
    """
    dialect = session.get_bind().dialect.name
    stmt = _STATEMENTS.get((dialect, name))
    if stmt is None:
        stmt = build(_dialect_insert(session))
        _STATEMENTS[dialect, name] = stmt
    return stmt


def _dialect_insert(session: AsyncSession) -> Callable[[Any], Any]:
    """The ``insert`` of the session's dialect (both have ``on_conflict_do_*``)."""
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def _insert(session: AsyncSession, table: Any) -> Any:
    return _dialect_insert(session)(table)


def _turn_upsert(insert: Any) -> Any:
    # Within a run, an ended turn's row moves a running row to its final status and nothing
    # moves an ended row. A run never seen before (a reset, a new run of the workflow id)
    # takes the row over; a late write of an earlier run never does. One statement: a
    # turn's last write is on its critical path.
    stmt = insert(TurnRow.__table__)
    turn, runs = TurnRow.__table__, TurnRunRow.__table__
    final = ("status", "ended_at", "call_count", "error", "error_type", "run_id")
    # ``excluded`` cannot be correlated into a subquery: the row's keys come as parameters.
    seen = (
        select(runs.c.run_id)
        .where(
            runs.c.turn_id == bindparam("this_turn_id"), runs.c.run_id == bindparam("this_run_id")
        )
        .exists()
    )
    return stmt.on_conflict_do_update(
        index_elements=["turn_id"],
        set_={column: stmt.excluded[column] for column in final},
        where=or_(
            and_(
                turn.c.run_id == stmt.excluded.run_id,
                turn.c.status == "running",
                stmt.excluded.status != "running",
            ),
            and_(turn.c.run_id != stmt.excluded.run_id, ~seen),
        ),
    )


def _run_insert(insert: Any) -> Any:
    # The run it branched from: the turn's most recent other run that wrote records.
    runs = TurnRunRow.__table__
    earlier = (
        select(runs.c.run_id)
        .where(runs.c.turn_id == bindparam("turn_id"), runs.c.run_id != bindparam("run_id"))
        .order_by(runs.c.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    return (
        insert(runs)
        .values(
            turn_id=bindparam("turn_id"),
            run_id=bindparam("run_id"),
            branched_from=earlier,
            created_at=bindparam("created_at"),
        )
        .on_conflict_do_nothing(index_elements=["turn_id", "run_id"])
    )


def _session_state_upsert(insert: Any) -> Any:
    stmt = insert(SessionStateRow.__table__)
    return stmt.on_conflict_do_update(
        index_elements=["session_id"],
        set_={k: stmt.excluded[k] for k in ("version", "state", "last_turn_id", "updated_at")},
        where=SessionStateRow.__table__.c.version < stmt.excluded.version,
    )


def _aware(value: datetime | None) -> datetime | None:
    # SQLite drops the zone; every time tooltrail stores is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


async def record_turn(session: AsyncSession, *, turn: TurnRecord, run_id: str = "") -> None:
    """Insert the turn row, or move it on: to its run's final status, or to a newer run.

    Within a run the row never regresses; the first write of a run never seen before (a
    reset) makes it the turn's latest run, and ``turn_run`` notes the run it branched from.
    """
    values = turn.model_dump()
    values["run_id"] = run_id or turn.run_id
    values["this_turn_id"], values["this_run_id"] = turn.turn_id, values["run_id"]
    await session.execute(_prepared(session, "turn", _turn_upsert), values)
    await session.execute(
        _prepared(session, "turn_run", _run_insert),
        {"turn_id": turn.turn_id, "run_id": values["run_id"], "created_at": datetime.now(UTC)},
    )


async def record_session_state(
    session: AsyncSession, *, session_id: str, turn_id: str, state: SessionState
) -> None:
    """Save a session's state unless a newer version is already stored."""
    values = {
        "session_id": session_id,
        "version": state.version,
        "state": state.model_dump(mode="json", exclude={"version"}),
        "last_turn_id": turn_id,
        "updated_at": datetime.now(UTC),
    }
    await session.execute(_prepared(session, "session_state", _session_state_upsert), values)


async def load_session_state(session: AsyncSession, *, session_id: str) -> SessionState:
    """Return a session's saved state, or a fresh one.

    Acknowledged loop warnings the saved state has not taken up yet join its warned set
    here, so the turn that reads the state carries them from then on.
    """
    # A plain row, not an ORM object: an agent run reads it at every model turn.
    table = SessionStateRow.__table__
    query = select(table.c.state, table.c.version, table.c.acknowledged).where(
        table.c.session_id == session_id
    )
    row = (await session.execute(query)).first()
    if row is None:
        return SessionState()
    state = SessionState.model_validate({**row.state, "version": row.version})
    _take_up_acknowledgements(state, row.acknowledged)
    return state


def _take_up_acknowledgements(state: SessionState, acknowledged: list[Any] | None) -> None:
    for entry in sorted(acknowledged or [], key=lambda item: int(item["id"])):
        if int(entry["id"]) > state.acks_applied:
            state.detector.acknowledge_loop_warning(Operation.model_validate(entry["op"]))
            state.acks_applied = int(entry["id"])


async def acknowledge_loop_warning(
    session: AsyncSession, *, session_id: str, pattern: str | None = None
) -> list[str]:
    """Acknowledge a session's loop warning (pipeline spec §10.2's warned set).

    The most repeated operations of the session's window (of ``pattern`` only, when given)
    are recorded as acknowledged; the session's next turn takes them into its warned set.

    Returns:
        The acknowledged patterns (``{tool}({param})``), empty when nothing matched.
    """
    table = SessionStateRow.__table__
    query = select(table.c.state, table.c.version, table.c.acknowledged).where(
        table.c.session_id == session_id
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()  # two acknowledgements never share a number
    row = (await session.execute(query)).first()
    if row is None:
        return []
    saved = SessionState.model_validate({**row.state, "version": row.version})
    current = saved.model_copy(deep=True)
    _take_up_acknowledgements(current, row.acknowledged)
    ops = current.detector.repeated(pattern)
    if not ops:
        return []
    # Entries the saved state took up already are dropped; the others stay pending.
    pending = [e for e in row.acknowledged or [] if int(e["id"]) > saved.acks_applied]
    last = max([saved.acks_applied, *(int(e["id"]) for e in pending)])
    pending += [
        {"id": last + number, "op": op.model_dump(mode="json")}
        for number, op in enumerate(ops, start=1)
    ]
    await session.execute(
        update(SessionStateRow).where(table.c.session_id == session_id).values(acknowledged=pending)
    )
    return sorted({op.pattern for op in ops})


async def record_events(
    session: AsyncSession, *, turn_id: str, events: Sequence[AuditEvent], run_id: str = ""
) -> str | None:
    """Insert events of a run; those already stored under (turn, run, seq) are left alone.

    Each record gets its run's hash chain digest (``tooltrail.core.chain``); a batch that does not
    start the run reads its predecessor's digest first (one read per batch, not per call).
    Returns the last record's digest (the run's head so far), or ``None``.
    """
    if not events:
        return None
    rows = [{"turn_id": turn_id, **event.model_dump(mode="json")} for event in events]
    for row, event in zip(rows, events, strict=True):
        row["created_at"] = event.created_at
        row["run_id"] = event.run_id or run_id
        # A model-chosen id or name that its column cannot take as it is (too long, NUL) is
        # stored as a stand-in; the payload keeps the original for ``list_events``.
        originals = {
            column: row[column]
            for column in _NAME_COLUMNS
            if row[column] is not None and not fits(row[column], _NAME_LENGTH)
        }
        if originals:
            row["payload"] = {**row["payload"], _ORIGINALS: originals}
    previous = await _previous_digest(session, turn_id=turn_id, row=rows[0])
    prior_seq = rows[0]["seq"] - 1
    for row, event in zip(rows, events, strict=True):
        # The digest covers the record as it reads back: the originals of stand-in columns
        # are back in their columns then, not in the payload.
        payload = {k: v for k, v in row["payload"].items() if k != _ORIGINALS}
        stored = event.model_copy(update={"payload": payload, "digest": None})
        if previous is None or row["seq"] != prior_seq + 1:
            previous = None  # not consecutive: no chain can be computed for these
        else:
            (previous,) = chain_digests(previous, [stored], row["run_id"])
        row["digest"] = previous
        prior_seq = row["seq"]
    stmt = _prepared(
        session,
        "events",
        lambda insert: insert(AuditEventRow.__table__).on_conflict_do_nothing(
            index_elements=["turn_id", "run_id", "seq"]
        ),
    )
    await session.execute(stmt, rows)
    return previous


async def _previous_digest(
    session: AsyncSession, *, turn_id: str, row: dict[str, Any]
) -> str | None:
    """The digest of the record before ``row`` in its run (``GENESIS`` before seq 0)."""
    if row["seq"] == 0:
        return GENESIS
    table = AuditEventRow.__table__
    found = await session.execute(
        select(table.c.digest).where(
            table.c.turn_id == turn_id,
            table.c.run_id == row["run_id"],
            table.c.seq == row["seq"] - 1,
        )
    )
    digest = found.scalar_one_or_none()
    return None if digest is None else str(digest)


async def _write_records(session: AsyncSession, flush: Flush) -> str | None:
    """A flush's audit part: turn row, events, session state, conversation (not memory)."""
    if flush.turn is not None:
        await record_turn(session, turn=flush.turn, run_id=flush.run_id)
    head = await record_events(
        session, turn_id=flush.turn_id, events=flush.events, run_id=flush.run_id
    )
    if flush.session is not None:
        await record_session_state(
            session, session_id=flush.session_id, turn_id=flush.turn_id, state=flush.session
        )
    if flush.conversation is not None:
        # An agent turn's tool results, where its run's next model call reads them.
        await append_messages(
            session,
            run_id=flush.conversation.run_id,
            start_seq=flush.conversation.start_seq,
            messages=flush.conversation.messages,
        )
    return head


async def record_memory(
    session: AsyncSession, *, entries: Sequence[MemoryEntry], run_id: str = ""
) -> None:
    """Insert memory entries of a run; those already stored under (turn, run, seq) stay."""
    if not entries:
        return
    rows = [entry.model_dump() for entry in entries]
    for row in rows:
        row["run_id"] = row["run_id"] or run_id
    stmt = _prepared(
        session,
        "memory",
        lambda insert: insert(MemoryEntryRow.__table__).on_conflict_do_nothing(
            index_elements=["turn_id", "run_id", "seq"]
        ),
    )
    await session.execute(stmt, rows)


async def list_events(
    session: AsyncSession, *, turn_id: str, all_runs: bool = False
) -> list[AuditEvent]:
    """Return the events of a turn's latest run ordered by ``seq`` (or of every run).

    With ``all_runs`` the runs come in the order they first wrote, each ordered by ``seq``.
    """
    query = select(AuditEventRow).where(AuditEventRow.turn_id == turn_id)
    if all_runs:
        first_write = (
            select(TurnRunRow.created_at)
            .where(TurnRunRow.turn_id == turn_id, TurnRunRow.run_id == AuditEventRow.run_id)
            .scalar_subquery()
        )
        query = query.order_by(first_write, AuditEventRow.run_id, AuditEventRow.seq)
    else:
        latest = select(TurnRow.run_id).where(TurnRow.turn_id == turn_id).scalar_subquery()
        query = query.where(AuditEventRow.run_id == latest).order_by(AuditEventRow.seq)
    rows = await session.scalars(query)
    events = []
    for row in rows:
        event = AuditEvent.model_validate(row, from_attributes=True)
        event.created_at = _aware(event.created_at) or event.created_at
        originals = event.payload.pop(_ORIGINALS, None)
        if isinstance(originals, dict):
            for column in _NAME_COLUMNS:
                if isinstance(originals.get(column), str):
                    setattr(event, column, originals[column])
        events.append(event)
    return events


async def list_memory(session: AsyncSession, *, session_id: str) -> list[MemoryEntry]:
    """Return a session's memory entries in the order they were made.

    Each turn's notes are those of its latest run (the run its ``turn`` row follows), as
    ``list_events`` shows: a reset turn's new run replaces what its earlier run noted. Notes
    whose run is unknown (empty ``run_id``: stored before memory was run-aware, or by an
    older worker) count as the latest run's while it has none of its own.
    """

    def latest_run(turn_id: Any) -> Any:
        return select(TurnRow.run_id).where(TurnRow.turn_id == turn_id).scalar_subquery()

    other = MemoryEntryRow.__table__.alias("of_latest")
    own = (
        select(other.c.id)
        .where(
            other.c.turn_id == MemoryEntryRow.turn_id,
            other.c.run_id == latest_run(other.c.turn_id),
        )
        .exists()
    )
    latest = latest_run(MemoryEntryRow.turn_id)
    ours = or_(
        MemoryEntryRow.run_id == func.coalesce(latest, MemoryEntryRow.run_id),
        and_(MemoryEntryRow.run_id == "", ~own),
    )
    rows = await session.scalars(
        select(MemoryEntryRow)
        .where(MemoryEntryRow.session_id == session_id, ours)
        .order_by(MemoryEntryRow.created_at, MemoryEntryRow.turn_id, MemoryEntryRow.seq)
    )
    entries = []
    for row in rows:
        entry = MemoryEntry.model_validate(row, from_attributes=True)
        entry.created_at = _aware(entry.created_at) or entry.created_at
        entries.append(entry)
    return entries


class TurnSummary(TurnRecord):
    """A turn row with counts from its audit trail."""

    error_results: int = 0
    """``tool_post`` events with a soft error."""
    event_count: int = 0


async def list_turns(
    session: AsyncSession,
    *,
    session_id: str | None = None,
    status: str | None = None,
    tool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    errors_only: bool = False,
    limit: int = 50,
) -> list[TurnSummary]:
    """Return the newest turns matching every given filter, newest first."""
    # Counts of the turn's latest run (the one its row describes).
    events = (
        select(
            AuditEventRow.turn_id.label("turn_id"),
            AuditEventRow.run_id.label("run_id"),
            func.count().label("event_count"),
            func.count()
            .filter(
                AuditEventRow.kind == "tool_post", AuditEventRow.payload["is_error"].as_boolean()
            )
            .label("error_results"),
        )
        .group_by(AuditEventRow.turn_id, AuditEventRow.run_id)
        .subquery()
    )
    query: Select[Any] = select(  # type: ignore[assignment]
        TurnRow,
        func.coalesce(events.c.event_count, 0),
        func.coalesce(events.c.error_results, 0),
    ).outerjoin(
        events, and_(events.c.turn_id == TurnRow.turn_id, events.c.run_id == TurnRow.run_id)
    )
    if session_id is not None:
        query = query.where(TurnRow.session_id == session_id)
    if status is not None:
        query = query.where(TurnRow.status == status)
    if since is not None:
        query = query.where(TurnRow.started_at >= since)
    if until is not None:
        query = query.where(TurnRow.started_at < until)
    if tool is not None:
        query = query.where(
            select(AuditEventRow.id)
            .where(AuditEventRow.turn_id == TurnRow.turn_id, AuditEventRow.tool_name == tool)
            .exists()
        )
    if errors_only:
        query = query.where(
            (TurnRow.status.in_(["failed", "cancelled", "terminated", "timed_out", "lost"]))
            | (events.c.error_results > 0)
        )
    query = query.order_by(TurnRow.started_at.desc(), TurnRow.turn_id).limit(limit)
    summaries = []
    for row, event_count, error_results in (await session.execute(query)).all():
        summary = TurnSummary.model_validate(row, from_attributes=True)
        summary.started_at = _aware(summary.started_at) or summary.started_at
        summary.ended_at = _aware(summary.ended_at)
        summary.event_count = int(event_count)
        summary.error_results = int(error_results)
        summaries.append(summary)
    return summaries


class AuditStore:
    """The audit database of one worker or client: an engine and its session factory."""

    def __init__(self, url: str, **engine_kwargs: Any) -> None:
        """Open (lazily) the database at ``url``."""
        self.url = url
        self.worker_claims = 0
        """Workers built on this store that hold its SQLite file (``db.sqlite_guard``)."""
        self.engine: AsyncEngine = create_engine(url, **engine_kwargs)
        self.sessions: async_sessionmaker[AsyncSession] = session_factory(self.engine)

    async def write_flush(self, flush: Flush) -> str | None:
        """Write a flush: turn row, events, session state, conversation and memory.

        One transaction holds them all (a commit fewer per batch); when it fails and the flush
        has memory, the records are written on their own and the memory after them, so a
        memory failure never costs the audit trail its write.

        Returns:
            The digest of the flush's last event (its run's hash chain head so far), if any.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the turn row or the events could not be written.
                Memory failures are logged and dropped (memory keeps the gist; the audit
                trail has everything).
        """
        if flush.memory:
            try:
                async with self.sessions.begin() as session:
                    head = await _write_records(session, flush)
                    await record_memory(session, entries=flush.memory, run_id=flush.run_id)
                return head
            except Exception:
                log.debug(
                    "flush of turn %r failed in one transaction; writing its parts apart",
                    flush.turn_id,
                    exc_info=True,
                )
        head = None
        if (
            flush.turn is not None
            or flush.events
            or flush.session is not None
            or flush.conversation is not None
        ):
            async with self.sessions.begin() as session:
                head = await _write_records(session, flush)
        if flush.memory:
            try:
                async with self.sessions.begin() as session:
                    await record_memory(session, entries=flush.memory, run_id=flush.run_id)
            except Exception:
                log.warning(
                    "memory store failed; %d entries of turn %r dropped",
                    len(flush.memory),
                    flush.turn_id,
                    exc_info=True,
                )
        return head

    async def session_state(self, session_id: str) -> SessionState:
        """Return the state the session's last turn saved (or a fresh one)."""
        async with self.sessions() as session:
            return await load_session_state(session, session_id=session_id)

    async def acknowledge_loop_warning(
        self, session_id: str, pattern: str | None = None
    ) -> list[str]:
        """Acknowledge a session's loop warning; see the module function of that name."""
        async with self.sessions.begin() as session:
            return await acknowledge_loop_warning(session, session_id=session_id, pattern=pattern)

    async def events(self, turn_id: str, *, all_runs: bool = False) -> list[AuditEvent]:
        """Return the events of a turn's latest run (or every run's), large outputs filled in."""
        async with self.sessions() as session:
            events = await list_events(session, turn_id=turn_id, all_runs=all_runs)
            refs = [e.payload["output_ref"] for e in events if e.payload.get("output_ref")]
            blobs = await get_blobs(session, keys=refs)
        for event in events:
            ref = event.payload.get("output_ref")
            if ref in blobs:
                event.payload["output"] = blobs[ref]
        return events

    async def chain_problems(
        self, turn_id: str, *, heads: dict[str, str] | None = None
    ) -> dict[str, list[str]]:
        """Recompute the hash chain of each run of a turn; return the problems by run id.

        Args:
            turn_id: the turn.
            heads: known head digests by run id (kept outside the database), if any.
        """
        # The records as stored: a large output's blob is not part of its record's digest
        # (the record holds its reference and hash; ``verify`` checks the blob's digest).
        async with self.sessions() as session:
            events = await list_events(session, turn_id=turn_id, all_runs=True)
        by_run: dict[str, list[AuditEvent]] = {}
        for event in events:
            by_run.setdefault(event.run_id or "", []).append(event)
        known = heads or {}
        return {
            run_id: verify_chain(records, head=known.get(run_id))
            for run_id, records in by_run.items()
        }

    async def runs(self, turn_id: str) -> list[TurnRun]:
        """Return the Temporal runs of a turn that wrote records, in the order they did."""
        async with self.sessions() as session:
            latest = await session.scalar(select(TurnRow.run_id).where(TurnRow.turn_id == turn_id))
            rows = await session.scalars(
                select(TurnRunRow)
                .where(TurnRunRow.turn_id == turn_id)
                .order_by(TurnRunRow.created_at, TurnRunRow.run_id)
            )
            return [
                TurnRun(
                    run_id=row.run_id,
                    branched_from=row.branched_from,
                    created_at=_aware(row.created_at) or row.created_at,
                    latest=row.run_id == latest,
                )
                for row in rows
            ]

    async def put_blob(self, key: str, output: Any, size: int) -> None:
        """Store a large output under its key."""
        async with self.sessions.begin() as session:
            await put_blob(session, key=key, output=output, size=size)

    async def blobs(self, keys: Sequence[str]) -> dict[str, Any]:
        """Return stored large outputs by key."""
        async with self.sessions() as session:
            return await get_blobs(session, keys=keys)

    async def memory(self, session_id: str) -> list[MemoryEntry]:
        """Return a session's memory entries."""
        async with self.sessions() as session:
            return await list_memory(session, session_id=session_id)

    async def turns(self, **filters: Any) -> list[TurnSummary]:
        """Return turns matching the filters of ``list_turns``."""
        async with self.sessions() as session:
            return await list_turns(session, **filters)

    async def turn(self, turn_id: str) -> TurnRecord | None:
        """Return one turn's row, or ``None``."""
        async with self.sessions() as session:
            row = await session.get(TurnRow, turn_id)
            if row is None:
                return None
            record = TurnRecord.model_validate(row, from_attributes=True)
            record.started_at = _aware(record.started_at) or record.started_at
            record.ended_at = _aware(record.ended_at)
            return record

    async def conversation(self, run_id: str) -> list[Message]:
        """Return an agent run's conversation, in order."""
        async with self.sessions() as session:
            return [message for _, message, _ in await load_conversation(session, run_id=run_id)]

    async def close(self) -> None:
        """Dispose of the engine's connections (and give back the workers' SQLite claims)."""
        while self.worker_claims > 0:
            self.worker_claims -= 1
            release_sqlite_file(self.url)
        await self.engine.dispose()


async def append_messages(
    session: AsyncSession, *, run_id: str, start_seq: int, messages: Sequence[Message]
) -> None:
    """Store messages at ``start_seq``...; positions already stored are left alone."""
    if not messages:
        return
    now = datetime.now(UTC)
    rows = [
        {
            "run_id": run_id,
            "seq": start_seq + offset,
            "role": message.role,
            "message": message.model_dump(mode="json"),
            "usage": None,
            "created_at": now,
        }
        for offset, message in enumerate(messages)
    ]
    await session.execute(_prepared(session, "message", _message_insert), rows)


def _message_insert(insert: Any) -> Any:
    return insert(ConversationMessageRow.__table__).on_conflict_do_nothing(
        index_elements=["run_id", "seq"]
    )


async def store_answer(
    session: AsyncSession, *, run_id: str, seq: int, response: ModelResponse
) -> None:
    """Store the model's answer at ``seq`` (once)."""
    row = {
        "run_id": run_id,
        "seq": seq,
        "role": "assistant",
        "message": response.message.model_dump(mode="json"),
        "usage": {**response.usage.model_dump(mode="json"), "stop_reason": response.stop_reason},
        "created_at": datetime.now(UTC),
    }
    await session.execute(_prepared(session, "message", _message_insert), row)


async def load_conversation(
    session: AsyncSession, *, run_id: str, up_to: int | None = None
) -> list[tuple[int, Message, ModelResponse | None]]:
    """Return ``(seq, message, answer)`` in order; ``answer`` is set for stored answers."""
    # Plain rows, not ORM objects: every model turn reads the whole conversation.
    table = ConversationMessageRow.__table__
    query = select(table.c.seq, table.c.message, table.c.usage).where(table.c.run_id == run_id)
    if up_to is not None:
        query = query.where(table.c.seq <= up_to)
    rows = await session.execute(query.order_by(table.c.seq))
    loaded = []
    for row in rows:
        message = Message.model_validate(row.message)
        answer = None
        if row.usage is not None:
            usage = dict(row.usage)
            stop_reason = str(usage.pop("stop_reason", "end_turn"))
            answer = ModelResponse(
                message=message, usage=Usage.model_validate(usage), stop_reason=stop_reason
            )
        loaded.append((row.seq, message, answer))
    return loaded


async def put_blob(session: AsyncSession, *, key: str, output: Any, size: int) -> None:
    """Store a large output under its content hash (once)."""
    row = {"key": key, "size": size, "content": {"output": output}, "created_at": datetime.now(UTC)}
    stmt = _prepared(
        session,
        "blob",
        lambda insert: insert(BlobRow.__table__).on_conflict_do_nothing(index_elements=["key"]),
    )
    await session.execute(stmt, row)


async def get_blobs(session: AsyncSession, *, keys: Sequence[str]) -> dict[str, Any]:
    """Return stored outputs by key."""
    if not keys:
        return {}
    rows = await session.scalars(select(BlobRow).where(BlobRow.key.in_(list(set(keys)))))
    return {row.key: row.content["output"] for row in rows}
