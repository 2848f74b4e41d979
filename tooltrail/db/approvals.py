"""Approvals the turns refused, and the signed approvals they took up.

Refusals: written by the client that sent them, read by operators.

A turn's ``approval`` Update validator refuses a forged, replayed, expired or misdirected
approval before anything enters the workflow's history; the client that sent it records the
refusal here (``approval_rejection``), so ``tooltrail approvals history`` shows it beside the
decisions the trail holds.

Uses: a signed approval is taken up once across every run of its turn (``take_approval``):
the turn's run keeps the signatures it took, but a new run of the same workflow id starts
with none, and a copied Update would otherwise count again there.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from tooltrail.db.orm import ApprovalRejectionRow, ApprovalUseRow
from tooltrail.db.store import AuditStore

__all__ = [
    "RejectedApproval",
    "list_rejections",
    "record_rejection",
    "storable",
    "take_approval",
]


class RejectedApproval(BaseModel):
    """An approval a turn refused, and why."""

    turn_id: str
    tool_call_id: str
    approver: str | None
    reason: str
    answer: str
    """The approval as sent, JSON text."""
    created_at: datetime


def storable(text: str) -> str:
    """``text`` as every supported database stores it: NUL bytes and lone surrogates escaped."""
    clean = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return clean.replace("\x00", "\\x00")


async def record_rejection(store: AuditStore, rejected: RejectedApproval) -> None:
    """Write one refused approval."""
    async with store.sessions.begin() as session:
        session.add(
            ApprovalRejectionRow(
                turn_id=storable(rejected.turn_id),
                tool_call_id=storable(rejected.tool_call_id),
                approver=None if rejected.approver is None else storable(rejected.approver),
                reason=storable(rejected.reason),
                answer=storable(rejected.answer),
                created_at=rejected.created_at,
            )
        )


async def list_rejections(store: AuditStore, turn_id: str) -> list[RejectedApproval]:
    """A turn's refused approvals, oldest first."""
    async with store.sessions() as session:
        rows = await session.scalars(
            select(ApprovalRejectionRow)
            .where(ApprovalRejectionRow.turn_id == turn_id)
            .order_by(ApprovalRejectionRow.created_at, ApprovalRejectionRow.id)
        )
        found = []
        for row in rows:
            item = RejectedApproval.model_validate(row, from_attributes=True)
            if item.created_at.tzinfo is None:  # SQLite keeps no zone: the column is UTC
                item.created_at = item.created_at.replace(tzinfo=UTC)
            found.append(item)
        return found


async def take_approval(
    store: AuditStore,
    signature_sha256: str,
    *,
    turn_id: str,
    run_id: str,
    tool_call_id: str,
) -> str | None:
    """Take up a signed approval for a call of a run; why not, if it was used elsewhere.

    Taking it up again for the same run and call answers ``None`` (a retried activity).

    Returns:
        ``None`` when taken up, else the refusal's reason naming the run that used it.
    """
    try:
        async with store.sessions.begin() as session:
            session.add(
                ApprovalUseRow(
                    signature_sha256=signature_sha256,
                    turn_id=storable(turn_id),
                    run_id=run_id,
                    tool_call_id=storable(tool_call_id),
                    used_at=datetime.now(UTC),
                )
            )
    except IntegrityError:
        async with store.sessions() as session:
            row = await session.get(ApprovalUseRow, signature_sha256)
        if row is None:  # pragma: no cover - a row that refused the insert cannot vanish
            raise
        if row.run_id == run_id and row.tool_call_id == storable(tool_call_id):
            return None
        return (
            f"this signed approval was already used, by call {row.tool_call_id!r} in run "
            f"{row.run_id!r} of turn {row.turn_id!r}"
        )
    return None
