"""The audit database schema (SQLAlchemy 2, typed). Changes only through Alembic migrations.

Table names are fixed so operators can query them directly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tooltrail.db.encoding import SafeJson, SafeString, SafeText

__all__ = [
    "ApprovalRejectionRow",
    "AuditEventRow",
    "Base",
    "BlobRow",
    "ConversationMessageRow",
    "IdempotencyRecordRow",
    "MaintenanceLeaseRow",
    "MemoryEntryRow",
    "ModelCallRow",
    "RebuildWatermarkRow",
    "RunForkRow",
    "SessionStateRow",
    "ToolHealthRow",
    "ToolRegistryRow",
    "TurnRow",
    "TurnRunRow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSONB on PostgreSQL (indexable, compact); plain JSON text elsewhere. Text that PostgreSQL
# refuses (NUL) is stored losslessly: see ``tooltrail.db.encoding``.
JsonType = SafeJson()
# SQLite only auto-increments INTEGER PRIMARY KEY columns.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """Declarative base with a naming convention, so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class TurnRow(Base):
    """One turn workflow execution."""

    __tablename__ = "turn"

    turn_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(255), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    """Indexed: reconciliation looks for the few ``running`` turns every interval."""
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    call_count: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(SafeText)
    error_type: Mapped[str | None] = mapped_column(String(64))
    rerun_of: Mapped[str | None] = mapped_column(String(255), index=True)
    """The turn this one re-runs (``tooltrail rerun``), if any."""
    mode: Mapped[str] = mapped_column(String(16), default="live", server_default="live")
    """``live``, ``rerun`` (tools ran again) or ``shadow`` (results served from the trail)."""
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When background reconciliation last asked Temporal about this running turn."""
    run_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    """The Temporal run the row describes: the latest run of the turn's workflow id."""


class TurnRunRow(Base):
    """One Temporal run of a turn's workflow id that wrote records (a reset adds one)."""

    __tablename__ = "turn_run"

    turn_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("turn.turn_id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    branched_from: Mapped[str | None] = mapped_column(String(255))
    """The turn's latest run when this one first wrote (the run it branched from), if any."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class AuditEventRow(Base):
    """One event of a turn's run; unique per (turn, run, seq), so re-sent events are written once.

    Every run of the turn's workflow id (a reset makes a new one) keeps its own records.
    """

    __tablename__ = "audit_event"
    __table_args__ = (
        UniqueConstraint("turn_id", "run_id", "seq"),
        Index(None, "tool_name"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    turn_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("turn.turn_id", ondelete="CASCADE")
    )
    run_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    """The Temporal run that produced the record (empty for records older than run ids)."""
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    # Chosen by the model: a value that does not fit is stored as a stand-in, the original
    # in the payload (``tooltrail.db.store.record_events``).
    tool_call_id: Mapped[str | None] = mapped_column(SafeString(255))
    tool_name: Mapped[str | None] = mapped_column(SafeString(255))
    attempt: Mapped[int | None] = mapped_column(Integer)
    temporal_attempt: Mapped[int | None] = mapped_column(Integer)
    """Temporal's activity attempt (from 1) that ran the body, for attempt records."""
    worker: Mapped[str | None] = mapped_column(String(255))
    """The identity of the worker that ran that attempt, for attempt records."""
    digest: Mapped[str | None] = mapped_column(String(64))
    """The run's hash chain at this record (``tooltrail.core.chain``)."""
    payload: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class MemoryEntryRow(Base):
    """One memory note of a session; unique per (turn, run, seq of the call's post event).

    Run-aware like ``audit_event``: a reset turn's new run keeps its own notes.
    """

    __tablename__ = "memory_entry"
    __table_args__ = (UniqueConstraint("turn_id", "run_id", "seq"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(255), index=True)
    turn_id: Mapped[str] = mapped_column(String(255))
    run_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    """The Temporal run that made the note; empty: unknown (see the migration 3c8e1f0a7b52)."""
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    content: Mapped[str] = mapped_column(SafeText)
    tool_call_id: Mapped[str | None] = mapped_column(SafeString(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ToolHealthRow(Base):
    """One circuit breaker per tool name, shared by every worker (spec §11).

    The configuration is frozen into the row when the breaker is created, so a later config
    change affects only breakers created after it.
    """

    __tablename__ = "tool_health"
    __table_args__ = (CheckConstraint("state IN ('closed', 'open', 'half_open')", name="state"),)

    # The requested name (a caller may advertise any): one that does not fit is a stand-in.
    tool_name: Mapped[str] = mapped_column(SafeString(255), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default="closed")
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_failure_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    probe_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failure_threshold: Mapped[int] = mapped_column(Integer)
    recovery_ms: Mapped[int] = mapped_column(BigInteger)
    probe_timeout_ms: Mapped[int] = mapped_column(BigInteger)
    successes: Mapped[int] = mapped_column(BigInteger, default=0)
    failures: Mapped[int] = mapped_column(BigInteger, default=0)
    ewma_micros: Mapped[int] = mapped_column(BigInteger, default=1_000_000)
    """Exponentially weighted success rate, fixed point x1,000,000 (telemetry only)."""
    last_duration_ms: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class IdempotencyRecordRow(Base):
    """One idempotency key's claim and outcome (guardrails spec §5.4)."""

    __tablename__ = "idempotency_record"
    __table_args__ = (
        CheckConstraint("state IN ('pending', 'succeeded', 'failed')", name="state"),
        Index(None, "expires_at"),
    )

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    tool_name: Mapped[str] = mapped_column(String(255))
    scope_principal: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    source_call_id: Mapped[str | None] = mapped_column(SafeString(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SessionStateRow(Base):
    """State that spans the turns of a session (the loop detector's window), by session.

    ``version`` counts the turns that saved it, so a late write of an older turn never
    overwrites a newer one.
    """

    __tablename__ = "session_state"

    session_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[dict[str, Any]] = mapped_column(JsonType)
    last_turn_id: Mapped[str | None] = mapped_column(String(255))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    acknowledged: Mapped[list[dict[str, Any]] | None] = mapped_column(JsonType)
    """Loop warnings the host acknowledged (``acknowledge_loop_warning``), numbered, that a
    turn has not taken up yet. A column of their own: a turn's state write never touches it,
    so an acknowledgement made while a turn runs is not lost."""


class ConversationMessageRow(Base):
    """One message of an agent run's conversation, by run and position.

    The conversation lives here, not in workflow history: each model call's activity reads
    it and appends to it, so a long run's history grows with its turns, not quadratically.
    """

    __tablename__ = "conversation_message"

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    message: Mapped[dict[str, Any]] = mapped_column(JsonType)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    """For assistant messages: the token usage of the call that produced it."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class BlobRow(Base):
    """A large tool output, kept out of workflow history (the history holds its key)."""

    __tablename__ = "blob"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 of the content."""
    size: Mapped[int] = mapped_column(BigInteger)
    content: Mapped[dict[str, Any]] = mapped_column(JsonType)
    """``{"output": <text or parts>}``."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class MaintenanceLeaseRow(Base):
    """A lease on a job that one worker of a deployment does at a time (by job name).

    Background reconciliation takes ``reconcile``: the holder renews it each pass; when
    it stops renewing (a lost worker), another takes it over once ``expires_at`` passed.
    """

    __tablename__ = "maintenance_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RebuildWatermarkRow(Base):
    """How far reconciliation has looked for closed turns that have no row (per queue).

    Reconciliation lists the ``TurnWorkflow`` executions that closed since ``closed_since``
    (newest first, as Temporal's visibility lists them) and rebuilds the trail of those the
    database lacks. A pass that stops at its batch remembers where it got to
    (``resume_before`` within the window that ends at ``window_end``), so the next pass goes
    on from there; a finished window moves ``closed_since`` up.
    """

    __tablename__ = "rebuild_watermark"

    namespace: Mapped[str] = mapped_column(String(255), primary_key=True)
    task_queue: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The deployment's task queue (empty: every turn of the namespace)."""
    closed_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """Turns that closed before this time were all looked at (``None``: none yet)."""
    window_end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """The end of the window being listed (``None``: no window under way)."""
    resume_before: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """Within the window, turns closed at or after this time were looked at."""
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ApprovalRejectionRow(Base):
    """An approval the turn's validator refused (a rejected Update leaves no history).

    Written by the client that sent it; the texts are stored as they came, NUL bytes and
    lone surrogates escaped (PostgreSQL refuses them), so nothing a sender chose is lost.
    """

    __tablename__ = "approval_rejection"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    turn_id: Mapped[str] = mapped_column(SafeText, index=True)
    tool_call_id: Mapped[str] = mapped_column(SafeText)
    approver: Mapped[str | None] = mapped_column(SafeText)
    """Who the approval says decided (the signed statement's approver, or ``by``)."""
    reason: Mapped[str] = mapped_column(SafeText)
    """The validator's reason."""
    answer: Mapped[str] = mapped_column(SafeText)
    """The approval as sent (JSON text: the statement and its signature, if signed)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ApprovalUseRow(Base):
    """A signed approval a turn took up: a signature counts once across all runs.

    The turn's own run keeps the signatures it took up too, but a new run of the same
    workflow id starts with none; this row is what refuses a copied approval there.
    """

    __tablename__ = "approval_use"

    signature_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 of the decoded signature bytes (one row per signature, however spelled)."""
    turn_id: Mapped[str] = mapped_column(SafeText)
    run_id: Mapped[str] = mapped_column(String(255))
    tool_call_id: Mapped[str] = mapped_column(SafeText)
    used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RunForkRow(Base):
    """An agent run forked from another run's conversation (``Tooltrail.fork_agent``).

    One row links both runs: the new run reads it as "forked from", the original as "forked
    to". Runs have no row of their own (their turns and conversation do), so the link is
    kept here rather than as an audit event of a turn.
    """

    __tablename__ = "run_fork"

    run_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The new run."""
    source_run_id: Mapped[str] = mapped_column(String(255), index=True)
    """The run it was forked from."""
    from_turn: Mapped[int] = mapped_column(Integer)
    """The original's turn (0-based) the new run starts again from."""
    message_replaced: Mapped[bool] = mapped_column(Boolean)
    """Whether the last user message of the copied conversation was replaced."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ToolRegistryRow(Base):
    """One registry (tool set) of the workers polling a task queue.

    The directory itself is ``tooltrail.pipeline.directory``.

    Each worker upserts its row at start and then every 30 s, so the workers of a queue can
    tell which peer has a tool they lack and send its calls there.
    """

    __tablename__ = "tool_registry"

    task_queue: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    """``registry_fingerprint`` of the tool names."""
    tools: Mapped[dict[str, Any]] = mapped_column(JsonType)
    """The tool names, each with its settings (``ToolMeta``, as JSON)."""
    catalog: Mapped[str] = mapped_column(SafeText)
    """The tools' catalog entries in OpenAI's ``tools`` format, as JSON text (a list).

    Text, not JSON: JSONB would reorder the keys of each schema, and a model offered a
    peer's tool should see exactly the entry that tool's own worker offers (a prompt cache
    keys on the bytes).
    """
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    mac: Mapped[str] = mapped_column(String(100), default="", server_default="")
    """The publishing worker's HMAC over the row (``tooltrail.core.proofs.row_mac``): peers
    ignore a row without a valid one, so a row written in SQL diverts no call."""


class WorkerApproversRow(Base):
    """The approvers each worker of a task queue accepts signed approvals from.

    Written by every worker with its registry row; a worker that sees a live peer of its
    queue with another approver set refuses interactive turns (one worker without approvers
    would otherwise take unsigned answers for turns the others would hold to signatures).
    """

    __tablename__ = "worker_approvers"

    task_queue: Mapped[str] = mapped_column(String(255), primary_key=True)
    worker: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The worker's Temporal identity."""
    approvers: Mapped[str] = mapped_column(String(64))
    """``approvers_fingerprint`` of its approver set; empty: unsigned approvals."""
    mac: Mapped[str] = mapped_column(String(100))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ModelCallRow(Base):
    """One attempt of a model call: the answer's tokens and cost, or the failure.

    Unique per (turn, Temporal run, conversation position, Temporal attempt): every attempt
    is a call of its own (a rate-limited one and its retry are two rows), while a write the
    same attempt repeats lands once. No foreign key to ``turn``: a turn's model call runs
    before its first audit write.
    """

    __tablename__ = "model_call"
    __table_args__ = (UniqueConstraint("turn_id", "temporal_run_id", "seq", "attempt"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    turn_id: Mapped[str] = mapped_column(String(255))
    temporal_run_id: Mapped[str] = mapped_column(String(255))
    run_id: Mapped[str] = mapped_column(String(255), index=True)
    """The agent run (its conversation's id)."""
    seq: Mapped[int] = mapped_column(Integer)
    """The conversation position of the answer asked for."""
    attempt: Mapped[int] = mapped_column(Integer)
    """Temporal's attempt number of the model activity (1 first)."""
    provider: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(SafeText)
    request_sha256: Mapped[str] = mapped_column(String(64))
    """SHA-256 of the canonical JSON of the request (messages, tools and settings)."""
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    latency_ms: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    """Of ``input_tokens``, read from the prompt cache."""
    cache_write_tokens: Mapped[int | None] = mapped_column(Integer)
    """Of ``input_tokens``, written to the prompt cache."""
    reasoning_tokens: Mapped[int | None] = mapped_column(Integer)
    """Of ``output_tokens``, spent reasoning (when the provider reports them)."""
    stop_reason: Mapped[str | None] = mapped_column(SafeText)
    error_type: Mapped[str | None] = mapped_column(SafeText)
    error: Mapped[str | None] = mapped_column(SafeText)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    """Estimated from the operator's price table (``TOOLTRAIL_MODEL_PRICES``), if priced."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
