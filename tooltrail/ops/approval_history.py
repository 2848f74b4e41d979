"""A turn's approval history: every decision, who signed it, and whether it still verifies.

Two sources: the trail's ``hook_decision`` events of ``Ask``s (what the turn decided, with
the signed statement it accepted) and the ``approval_rejection`` rows (what it refused,
recorded by the clients that sent them). A signature is re-checked against the approvers
configured now, so a key taken out of the list shows up as no longer verifying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from tooltrail.core.signatures import SignedApproval, signature_problem
from tooltrail.core.wire import ApprovalInput, AuditEvent
from tooltrail.db.approvals import RejectedApproval

__all__ = ["ApprovalRecord", "approval_history"]


class ApprovalRecord(BaseModel):
    """One decision on a call that asked for approval, or one refused answer."""

    at: datetime
    tool_call_id: str
    tool_name: str | None = None
    outcome: str
    """``approved``, ``denied``, ``expired``, ``refused (...)`` from the trail, or
    ``rejected`` for an answer the turn refused."""
    by: str | None = None
    """The signed statement's approver, or the unsigned ``by`` (a claim)."""
    signed: bool = False
    verifies: bool | None = None
    """Whether the signature verifies with today's approvers; ``None``: unsigned."""
    problem: str | None = None
    """Why it does not verify (or why the turn refused it)."""
    reason: str | None = None
    """A denial's reason."""
    signature: str | None = None


def _check(signed: Any, approvers: Mapping[str, str]) -> tuple[SignedApproval | None, str | None]:
    """The signed approval and why it does not verify (``None``: it verifies)."""
    if signed is None:
        return None, None
    try:
        parsed = SignedApproval.model_validate(signed)
    except ValidationError:
        return None, "the recorded statement is malformed"
    return parsed, signature_problem(parsed, approvers)


def approval_history(
    events: Sequence[AuditEvent],
    rejections: Sequence[RejectedApproval],
    approvers: Mapping[str, str],
) -> list[ApprovalRecord]:
    """Merge a turn's decisions and refusals in time order, re-checking every signature.

    Args:
        events: the turn's audit events.
        rejections: the turn's refused answers.
        approvers: the approvers configured now, name to base64 public key.
    """
    records: list[ApprovalRecord] = []
    for event in events:
        payload = event.payload
        if event.kind != "hook_decision" or payload.get("decision") != "ask":
            continue
        signed, problem = _check(payload.get("signed"), approvers)
        records.append(
            ApprovalRecord(
                at=event.created_at,
                tool_call_id=event.tool_call_id or "",
                tool_name=event.tool_name,
                outcome=str(payload.get("outcome", "")),
                by=signed.statement.approver if signed else payload.get("by"),
                signed=signed is not None,
                verifies=None if signed is None else problem is None,
                problem=problem,
                reason=payload.get("reason"),
                signature=signed.signature if signed else None,
            )
        )
    for rejected in rejections:
        try:
            answer: ApprovalInput | None = ApprovalInput.model_validate_json(rejected.answer)
        except ValidationError:
            answer = None
        sent = answer.signed if answer is not None else None
        signed, problem = _check(None if sent is None else sent.model_dump(), approvers)
        records.append(
            ApprovalRecord(
                at=rejected.created_at,
                tool_call_id=rejected.tool_call_id,
                outcome="rejected",
                by=rejected.approver,
                signed=signed is not None,
                verifies=None if signed is None else problem is None,
                problem=rejected.reason,
                reason=answer.reason if answer is not None else None,
                signature=signed.signature if signed else None,
            )
        )
    records.sort(key=lambda r: r.at)
    return records
