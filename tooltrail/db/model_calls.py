"""Model calls in SQL: one row per attempt, what it cost, and why it failed.

The model activity writes a row for every attempt it makes (an answer, a rate limit, a
timeout, a cut-off answer), keyed on (turn, Temporal run, conversation position, Temporal
attempt): a retried write of the same attempt lands once, and each retry Temporal makes is
a row of its own. The ``model_response`` audit event says what the turn did with the answer;
these rows say what asking for it took.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tooltrail.db.orm import ModelCallRow
from tooltrail.db.store import _aware, _insert

__all__ = ["ModelCall", "ModelCallTotals", "list_model_calls", "record_model_call", "totals"]


class ModelCall(BaseModel):
    """One attempt of a model call, as the model activity recorded it."""

    model_config = ConfigDict(from_attributes=True)

    turn_id: str
    temporal_run_id: str
    run_id: str
    """The agent run (its conversation's id)."""
    seq: int
    """The conversation position of the answer asked for."""
    attempt: int
    """Temporal's attempt number of the model activity (1 first)."""
    provider: str | None = None
    model: str | None = None
    request_sha256: str
    """SHA-256 of the canonical JSON of the request: equal digests, equal requests."""
    started_at: datetime
    latency_ms: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    stop_reason: str | None = None
    error_type: str | None = None
    """The ``ApplicationError`` type the attempt failed with (``ModelUnavailable``, ...)."""
    error: str | None = None
    cost_usd: float | None = None
    """Estimated from the operator's price table; ``None`` when the model has no price."""


class ModelCallTotals(BaseModel):
    """The sums over some model calls (unpriced calls add nothing to ``cost_usd``)."""

    calls: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None
    """``None`` when no call was priced."""
    unpriced: int = 0
    """Calls that used tokens but whose model has no price."""


def totals(calls: list[ModelCall]) -> ModelCallTotals:
    """Return the sums of ``calls``."""
    sums = ModelCallTotals(calls=len(calls))
    for call in calls:
        sums.failed += call.error is not None
        sums.input_tokens += call.input_tokens or 0
        sums.output_tokens += call.output_tokens or 0
        sums.cached_tokens += call.cached_tokens or 0
        sums.reasoning_tokens += call.reasoning_tokens or 0
        if call.cost_usd is not None:
            sums.cost_usd = (sums.cost_usd or 0.0) + call.cost_usd
        elif call.input_tokens or call.output_tokens:
            sums.unpriced += 1
    return sums


async def record_model_call(
    session: AsyncSession, *, call: ModelCall, created_at: datetime
) -> None:
    """Store one attempt (once: a second write of the same attempt is a no-op)."""
    stmt = _insert(session, ModelCallRow.__table__).on_conflict_do_nothing(
        index_elements=["turn_id", "temporal_run_id", "seq", "attempt"]
    )
    await session.execute(stmt, {**call.model_dump(), "created_at": created_at})


async def list_model_calls(
    session: AsyncSession, *, turn_id: str | None = None, run_id: str | None = None
) -> list[ModelCall]:
    """Return the model calls of a turn or of an agent run (or both filters), in order.

    Raises:
        ValueError: neither ``turn_id`` nor ``run_id`` is given.
    """
    if turn_id is None and run_id is None:
        raise ValueError("list_model_calls needs a turn_id or a run_id")
    query = select(ModelCallRow)
    if turn_id is not None:
        query = query.where(ModelCallRow.turn_id == turn_id)
    if run_id is not None:
        query = query.where(ModelCallRow.run_id == run_id)
    rows = await session.scalars(
        query.order_by(ModelCallRow.seq, ModelCallRow.started_at, ModelCallRow.attempt)
    )
    calls = []
    for row in rows:
        call = ModelCall.model_validate(row, from_attributes=True)
        call.started_at = _aware(call.started_at) or call.started_at
        calls.append(call)
    return calls
