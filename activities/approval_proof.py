"""The approval proof: an accepted approval taken up, and proven to the worker of the call.

The turn's ``approval`` Update validator accepts an approval (a signed one only if it verifies
for this turn, run, call and arguments); this local activity then takes it up where the
workflow cannot, in the database (a signed approval once across every run of its turn,
``tooltrail.db.approvals.take_approval``), and makes the proof the attempt carries to the
worker that runs the body (``tooltrail.core.proofs``). A worker without a worker key refuses
the approval with one line that says so: it could not prove it.
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio import activity

from tooltrail.activities.local_only import refuse_unless_local
from tooltrail.core.proofs import approval_proof, signature_fingerprint
from tooltrail.core.wire import APPROVAL_PROOF, ApprovalProofOutcome, ApprovalProofRequest
from tooltrail.db.approvals import take_approval
from tooltrail.db.store import AuditStore

__all__ = ["NO_WORKER_KEY", "ApprovalProofActivities"]

NO_WORKER_KEY = (
    "this worker holds no worker key (TOOLTRAIL_WORKER_KEY), so it cannot prove an approval "
    "to the worker that runs the call: approvals are refused until every worker of the task "
    "queue has the same key"
)
"""The refusal of a worker without a key (the turn answers the call with it)."""


class ApprovalProofActivities:
    """Takes up accepted approvals; one instance per worker."""

    def __init__(self, store: AuditStore, keys: Mapping[str, bytes]) -> None:
        """Wire the audit database and the worker keys (the first makes proofs)."""
        self.store = store
        self.keys = dict(keys)

    @activity.defn(name=APPROVAL_PROOF)
    async def prove(self, inp: ApprovalProofRequest) -> ApprovalProofOutcome:
        """Take up the approval and prove it; or say why not."""
        refuse_unless_local(APPROVAL_PROOF)
        info = activity.info()
        if not self.keys:
            return ApprovalProofOutcome(refused=NO_WORKER_KEY)
        run_id = info.workflow_run_id or ""
        if inp.signature is not None:
            fingerprint = signature_fingerprint(inp.signature)
            if fingerprint is None:  # the validator checked it: only a foreign input lands here
                return ApprovalProofOutcome(refused="the signature is not base64")
            used = await take_approval(
                self.store,
                fingerprint,
                turn_id=info.workflow_id or "",
                run_id=run_id,
                tool_call_id=inp.tool_call_id,
            )
            if used is not None:
                return ApprovalProofOutcome(refused=used)
        return ApprovalProofOutcome(
            proof=approval_proof(
                self.keys,
                workflow_id=info.workflow_id or "",
                run_id=run_id,
                tool_call_id=inp.tool_call_id,
                arguments_sha256=inp.arguments_sha256,
            )
        )
