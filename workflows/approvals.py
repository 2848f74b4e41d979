"""Step 2 of the pipeline, the workflow's side: what a pre-tool hook's refusal becomes.

A ``Block`` is the answer. An ``Ask`` is refused in a non-interactive turn; in an
interactive one the call is parked until a human answers through the turn's ``approval``
Update (or the timeout passes), with the trail written first so the human can read it.
With approvers configured (``HostFeatures.approvers``) an answer must carry a signed
statement that verifies against one of them, for this turn (and run, when it names one), this
call and the arguments about to run, unexpired and not used before: the Update's validator
refuses anything else with a reason, so a refused answer never enters the history and the call
keeps waiting. An accepted approval is then taken up by the worker (``tooltrail.approval.proof``,
a local activity): a signed one once across every run of the turn, and proven to the worker
that runs the call, so a namespace client cannot skip the hooks with a flag.
Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

from tooltrail.core.hooks import HookDecision, expired_ask_text, headless_ask_text
from tooltrail.core.proofs import signature_fingerprint
from tooltrail.core.results import ToolCall
from tooltrail.core.signatures import arguments_digest, check_approval
from tooltrail.core.wire import (
    APPROVAL_PROOF,
    ApprovalInput,
    ApprovalProofOutcome,
    ApprovalProofRequest,
    PendingApproval,
)
from tooltrail.workflows.state import TurnState
from tooltrail.workflows.trail import Trail

__all__ = [
    "APPROVAL_PROOF_PATCH",
    "ASK_EXPIRES_PATCH",
    "Approvals",
    "approval_rejection",
    "take_answer",
]

ASK_EXPIRES_PATCH = "ask-expires-in"
"""``workflow.patched`` id of an ``Ask`` with its own deadline."""
APPROVAL_PROOF_PATCH = "tooltrail-approval-proof"
"""``workflow.patched`` id of taking up an approval on the worker (``tooltrail.approval.proof``)
before the call runs."""


class Approvals:
    """Answers hook decisions, on the turn's state (its parked calls) and trail."""

    def __init__(self, state: TurnState, trail: Trail) -> None:
        """Share the turn's state and its trail."""
        self._state = state
        self._trail = trail

    async def refusal_text(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        hook: HookDecision,
    ) -> str | None:
        """Record the hook's decision; the refusal's text, or ``None`` once a human approved."""
        payload: dict[str, Any] = {"decision": hook.decision, "hook": hook.hook, "text": hook.text}
        text: str | None = hook.text
        if hook.decision == "ask":
            if not self._state.input.config.interactive:
                text = headless_ask_text(hook.text)
                payload["outcome"] = "refused (session not interactive)"
            else:
                answer, expired = await self._await(call, tool_name, arguments, hook)
                if expired:
                    # The ask's own deadline passed first: a denial that says so.
                    text = expired_ask_text(hook.text, hook.expires_in or 0.0)
                    payload.update(outcome="expired", reason=text)
                elif answer is None:
                    text = headless_ask_text(hook.text)
                    payload["outcome"] = "refused (no answer in time)"
                elif answer.approved:
                    refused = await self._prove(call, arguments, answer)
                    if refused is None:
                        text = None
                        payload.update(outcome="approved", by=answer.by)
                    else:
                        text = f"approval rejected: {refused}"
                        payload.update(outcome="refused (approval not taken up)", reason=text)
                else:
                    text = answer.reason or f"denied by {answer.by or 'a reviewer'}"
                    payload.update(outcome="denied", by=answer.by, reason=answer.reason)
                if answer is not None and answer.signed is not None:
                    # The statement and its signature, so the trail can be re-checked later.
                    payload["signed"] = answer.signed.model_dump(mode="json")
        self._trail.emit("hook_decision", payload, call_id=call.id, tool=tool_name, attempt=attempt)
        return text

    async def _prove(
        self, call: ToolCall, arguments: dict[str, Any], answer: ApprovalInput
    ) -> str | None:
        """Take up an approval on the worker and keep its proof; why not, if it refuses.

        The worker records a signed approval's use across every run of the turn (a copied
        Update counts once) and proves the approval to the worker that runs the call, which
        otherwise runs the pre-tool hooks again (``tooltrail.core.proofs``). Histories from
        before the proof have no marker: they take the approval as they did.
        """
        if not workflow.patched(APPROVAL_PROOF_PATCH):
            return None
        signed = answer.signed if self._state.plan.features.approvers else None
        outcome: ApprovalProofOutcome = await workflow.execute_local_activity(
            APPROVAL_PROOF,
            ApprovalProofRequest(
                tool_call_id=call.id,
                arguments_sha256=_digest(arguments) or "",
                signature=None if signed is None else signed.signature,
            ),
            result_type=ApprovalProofOutcome,
            start_to_close_timeout=timedelta(seconds=30),
        )
        if outcome.refused is None:
            self._state.approval_proofs[call.id] = outcome.proof
        return outcome.refused

    async def _await(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], hook: HookDecision
    ) -> tuple[ApprovalInput | None, bool]:
        """Park the call until the ``approval`` Update arrives or the wait ends.

        Returns the answer (``None``: none in time) and whether the ask's own deadline
        (``Ask(expires_in=...)``) is what ended the wait.
        """
        state = self._state
        await self._trail.checkpoint(force=True)  # a human may look at the trail meanwhile
        # A query's answer, not history: adding the times changes no replay.
        asked_at = workflow.now()
        seconds = state.input.config.approval_timeout_s
        expiring = False
        # Only an ask with its own deadline takes this path (histories recorded before it
        # carry none); the marker keeps its shorter timer apart from them all the same.
        if hook.expires_in is not None and workflow.patched(ASK_EXPIRES_PATCH):
            expiring = hook.expires_in <= seconds
            seconds = min(seconds, hook.expires_in)
        timeout = timedelta(seconds=seconds)
        state.waiting[call.id] = PendingApproval(
            tool_call_id=call.id,
            tool_name=tool_name,
            question=hook.text,
            arguments=arguments,
            asked_at=asked_at,
            deadline=asked_at + timeout,
            arguments_sha256=_digest(arguments),
        )
        try:
            await workflow.wait_condition(lambda: call.id in state.answers, timeout=timeout)
        except TimeoutError:
            return None, expiring
        finally:
            del state.waiting[call.id]
        return state.answers.pop(call.id), False


def _digest(arguments: dict[str, Any]) -> str | None:
    try:
        return arguments_digest(arguments)
    except ValueError:  # NaN or infinity: no canonical form
        return None


def approval_rejection(state: TurnState, answer: ApprovalInput) -> str | None:
    """Why the turn refuses ``answer`` (the ``approval`` Update's validator), or ``None``.

    Read-only: a validator must not change the turn's state.
    """
    pending = state.waiting.get(answer.tool_call_id)
    if pending is None:
        names = ", ".join(sorted(state.waiting)) or "none"
        return f"call {answer.tool_call_id!r} is not waiting for approval (waiting: {names})"
    approvers = state.plan.features.approvers
    if not approvers:
        return None  # unsigned approvals: ``by`` is a claim
    signed = answer.signed
    if signed is None:
        return (
            "approval rejected: this deployment accepts only signed approvals "
            "(tooltrail approve --key FILE)"
        )
    reason = check_approval(
        signed,
        approvers=approvers,
        turn_id=state.record.turn_id,
        tool_call_id=answer.tool_call_id,
        arguments=pending.arguments,
        now=workflow.now(),
        used=state.used_signatures,
        run_id=workflow.info().run_id,
    )
    if reason is None and (signed.statement.decision == "approve") != answer.approved:
        reason = f"the signed decision is {signed.statement.decision!r}, the answer's is not"
    return None if reason is None else f"approval rejected: {reason}"


def take_answer(state: TurnState, answer: ApprovalInput) -> None:
    """Take up an answer the validator accepted; a signed one speaks for itself."""
    signed = answer.signed
    if signed is not None and state.plan.features.approvers:
        state.used_signatures.add(signature_fingerprint(signed.signature) or signed.signature)
        statement = signed.statement
        answer = answer.model_copy(update={"by": statement.approver, "reason": statement.reason})
    state.answers[answer.tool_call_id] = answer
