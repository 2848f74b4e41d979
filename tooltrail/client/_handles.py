"""The handles of started work: ``TurnHandle`` (results, cancel, approvals) and ``AgentHandle``.

Also what both share: ``wait_for_result`` (waits out the namespace's poller limit) and
``turn_error`` (a failed workflow as tooltrail's typed hard errors); ``TurnResult`` and
``WaitingApproval``, the shapes they return.
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, CancelledError, ChildWorkflowError
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.core.results import ToolDispatchResult
from tooltrail.core.signatures import ApprovalStatement, SignedApproval, arguments_digest
from tooltrail.core.wire import (
    AgentProgress,
    AgentRunOutput,
    ApprovalInput,
    PendingApproval,
    TurnOutput,
)
from tooltrail.db.approvals import RejectedApproval, list_rejections, record_rejection
from tooltrail.db.store import AuditStore
from tooltrail.errors import (
    ApprovalRejected,
    ConfigurationError,
    LoopDetected,
    ToolRecoveryExhausted,
    TurnCancelled,
    TurnError,
    TurnFailed,
)
from tooltrail.ops.approver_keys import load_approver_key, sign_statement

__all__ = [
    "DEFAULT_APPROVAL_VALIDITY",
    "AgentHandle",
    "TurnHandle",
    "TurnResult",
    "WaitingApproval",
    "turn_error",
    "wait_for_result",
]

log = logging.getLogger("tooltrail.client")

DEFAULT_APPROVAL_VALIDITY = timedelta(minutes=15)
"""How long a signed approval is valid unless the approver says otherwise."""

TurnResult = TurnOutput
"""The outcome of a turn: ``turn_id`` and ``results`` in the model's call order."""


def turn_error(failure: WorkflowFailureError, turn_id: str) -> TurnError:
    """Map a failed turn (or agent run) workflow to tooltrail's typed hard errors."""
    cause = failure.cause
    # An agent run fails because one of its turns did: report the turn's own hard error.
    while isinstance(cause, ChildWorkflowError) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, CancelledError):
        return TurnCancelled(turn_id=turn_id)
    if isinstance(cause, ApplicationError):
        details = list(cause.details)
        if cause.type == "LoopDetected":
            message = str(details[0]) if details else cause.message.removeprefix("Loop detected: ")
            return LoopDetected(message, turn_id=turn_id)
        if cause.type == "ToolRecoveryExhausted" and len(details) >= 2:
            return ToolRecoveryExhausted(str(details[0]), int(details[1]), turn_id=turn_id)
    return TurnFailed(f"turn {turn_id!r} failed: {cause or failure}", turn_id=turn_id)


# Waiting for a result is a long poll on the turn's history, and a namespace serves a
# bounded number of them at once (the frontend's ``frontend.namespaceCount``, 1,200 by
# default, also on the dev server): past it the server answers RESOURCE_EXHAUSTED "namespace
# concurrent poller limit exceeded", which the SDK's core retries 5 times and then raises.
# Such a wait is retried here, with jittered exponential backoff: a slot frees whenever a
# waited-for turn ends, and the retried poll then returns at once for a turn already done.
_POLLER_LIMIT = "concurrent poller limit"
_WAIT_RETRY_FIRST_S = 0.2
_WAIT_RETRY_MAX_S = 5.0


def _poller_limit(exc: RPCError) -> bool:
    return exc.status == RPCStatusCode.RESOURCE_EXHAUSTED and _POLLER_LIMIT in exc.message


async def wait_for_result(handle: WorkflowHandle[Any, Any]) -> Any:
    """Return ``handle.result()``, waiting out the namespace's concurrent poller limit.

    Raises:
        WorkflowFailureError: the workflow failed (as ``handle.result()``).
        RPCError: any other RPC failure.
    """
    delay = _WAIT_RETRY_FIRST_S
    retries = 0
    while True:
        try:
            return await handle.result()
        except RPCError as exc:
            if not _poller_limit(exc):
                raise
            retries += 1
            if retries == 1:
                log.info(
                    "waiting for %r: the namespace's concurrent poller limit is reached; "
                    "retrying with backoff",
                    handle.id,
                )
        await asyncio.sleep(random.uniform(0.5, 1.0) * delay)
        delay = min(delay * 2, _WAIT_RETRY_MAX_S)


class TurnHandle:
    """A started turn."""

    def __init__(
        self, handle: WorkflowHandle[Any, TurnOutput], store: AuditStore | None = None
    ) -> None:
        """Wrap a workflow handle (and the audit store that keeps large outputs)."""
        self._handle = handle
        self._store = store

    @property
    def turn_id(self) -> str:
        """The turn id (the workflow id)."""
        return self._handle.id

    @property
    def workflow_handle(self) -> WorkflowHandle[Any, TurnOutput]:
        """The underlying Temporal handle."""
        return self._handle

    async def result(self) -> TurnResult:
        """Wait for the turn's results (an agent turn's from the audit trail).

        Raises:
            LoopDetected: the loop detector stopped the turn.
            ToolRecoveryExhausted: a call hit the retry ceiling.
            TurnCancelled: the turn was cancelled.
            TurnFailed: the workflow failed for another reason.
        """
        try:
            output: TurnOutput = await wait_for_result(self._handle)
        except WorkflowFailureError as failure:
            raise turn_error(failure, self.turn_id) from failure
        calls = output.assistant.tool_calls if output.assistant is not None else []
        if calls and not output.results and self._store is not None:
            # An agent turn left its results to the conversation and the audit trail (see
            # ModelPhase); its tool phase's end holds them, in call order.
            events = await self._store.events(self.turn_id)
            ends = [e for e in events if e.kind == "turn_end" and e.payload.get("phase") == "tools"]
            if ends:
                output.results = [
                    ToolDispatchResult.model_validate(r) for r in ends[-1].payload["results"]
                ]
        refs = [r.output_ref for r in output.results if r.output_ref]
        if refs and self._store is not None:
            # Large outputs stayed out of history: fill them back in from the database.
            blobs = await self._store.blobs(refs)
            output.results = [
                ToolDispatchResult.model_validate(
                    {**r.model_dump(), "output": blobs[r.output_ref], "output_ref": None}
                )
                if r.output_ref in blobs
                else r
                for r in output.results
            ]
        return output

    async def cancel(self) -> None:
        """Request cancellation; ``result()`` then raises ``TurnCancelled``."""
        await self._handle.cancel()

    async def pending_approvals(self) -> list[PendingApproval]:
        """The calls of an interactive turn waiting for a human's decision."""
        pending: list[PendingApproval] = await self._handle.query(
            "pending_approvals", result_type=list[PendingApproval]
        )
        return pending

    async def approve(
        self,
        tool_call_id: str,
        *,
        by: str | None = None,
        key: Path | bytes | Ed25519PrivateKey | None = None,
        expires_in: timedelta = DEFAULT_APPROVAL_VALIDITY,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Approve a call parked on a hook's ``Ask``; it runs at once.

        Args:
            tool_call_id: the waiting call.
            by: who approves. Without ``key`` only a claim, recorded as given; with it, the
                approver name the deployment lists for the key.
            key: the approver's Ed25519 private key (a PEM file, PEM bytes or a key): signs
                the approval for this turn, this call and the arguments it waits with.
            expires_in: how long the signed approval is valid (the call may wait for its
                turn's workflow task meanwhile).
            arguments: the arguments the approver reviewed, which the signature binds to
                (default: the ones the call waits with, asked of the turn).

        Raises:
            ApprovalRejected: the turn refused it (not waiting, unsigned where approvers are
                configured, forged, expired, for other arguments...); the call keeps waiting.
            ConfigurationError: ``key`` without ``by``, or a key that cannot be used.
        """
        answer = ApprovalInput(tool_call_id=tool_call_id, approved=True, by=by)
        if key is not None:
            answer.signed = await self._sign(answer, key, expires_in, arguments)
        await self._answer(answer)

    async def deny(
        self,
        tool_call_id: str,
        reason: str,
        *,
        by: str | None = None,
        key: Path | bytes | Ed25519PrivateKey | None = None,
        expires_in: timedelta = DEFAULT_APPROVAL_VALIDITY,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Deny a call parked on a hook's ``Ask``; the model reads ``reason``.

        Args:
            tool_call_id: the waiting call.
            reason: why (signed with the rest when ``key`` is given).
            by: who denies (see ``approve``).
            key: the approver's private key (see ``approve``).
            expires_in: how long the signed denial is valid.
            arguments: the arguments the approver reviewed (see ``approve``).

        Raises:
            ApprovalRejected: the turn refused the answer; the call keeps waiting.
            ConfigurationError: ``key`` without ``by``, or a key that cannot be used.
        """
        answer = ApprovalInput(tool_call_id=tool_call_id, approved=False, reason=reason, by=by)
        if key is not None:
            answer.signed = await self._sign(answer, key, expires_in, arguments)
        await self._answer(answer)

    async def _sign(
        self,
        answer: ApprovalInput,
        key: Path | bytes | Ed25519PrivateKey,
        expires_in: timedelta,
        arguments: dict[str, Any] | None,
    ) -> SignedApproval:
        """Sign the answer for the reviewed arguments, by default the ones the call waits with."""
        if not answer.by:
            raise ConfigurationError("a signed approval needs the approver's name (by=...)")
        private = load_approver_key(key)
        if arguments is None:
            pending = {p.tool_call_id: p for p in await self.pending_approvals()}
            waiting = pending.get(answer.tool_call_id)
            if waiting is None:
                names = ", ".join(sorted(pending)) or "none"
                raise ApprovalRejected(
                    f"call {answer.tool_call_id!r} is not waiting for approval (waiting: {names})"
                )
            arguments = waiting.arguments
        try:
            digest = arguments_digest(arguments)
        except ValueError as exc:
            raise ConfigurationError(f"the arguments cannot be signed: {exc}") from None
        # The run that waits: a copy of the statement is worth nothing in a new run of the
        # same workflow id (the turn's validator compares it with its own run).
        run_id = (await self._handle.describe()).run_id
        statement = ApprovalStatement(
            approver=answer.by,
            turn_id=self.turn_id,
            run_id=run_id,
            tool_call_id=answer.tool_call_id,
            arguments_sha256=digest,
            decision="approve" if answer.approved else "deny",
            reason=answer.reason,
            expires_at=datetime.now(UTC) + expires_in,
        )
        return sign_statement(statement, private)

    async def submit_approval(self, answer: ApprovalInput) -> None:
        """Send a prepared answer, e.g. one signed elsewhere (a signing service, an HSM).

        Raises:
            ApprovalRejected: the turn refused it (and the refusal was recorded).
        """
        await self._answer(answer)

    async def _answer(self, answer: ApprovalInput) -> None:
        try:
            await self._handle.execute_update("approval", answer)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            await self._record_rejection(answer, message)
            raise ApprovalRejected(message) from exc

    async def _record_rejection(self, answer: ApprovalInput, reason: str) -> None:
        """Record a refused answer: a rejected Update leaves nothing in the history."""
        if self._store is None:
            return
        signed = answer.signed
        rejected = RejectedApproval(
            turn_id=self.turn_id,
            tool_call_id=answer.tool_call_id,
            approver=signed.statement.approver if signed is not None else answer.by,
            reason=reason,
            answer=answer.model_dump_json(),
            created_at=datetime.now(UTC),
        )
        try:
            await record_rejection(self._store, rejected)
        except Exception as exc:
            # The turn's refusal is the answer; a lost record must not hide it.
            log.warning("could not record the refused approval of turn %r: %s", self.turn_id, exc)
            log.debug("the record's failure", exc_info=True)

    async def approval_rejections(self) -> list[RejectedApproval]:
        """The answers this turn refused, as their senders recorded them, oldest first."""
        if self._store is None:
            return []
        return await list_rejections(self._store, self.turn_id)


class WaitingApproval(PendingApproval):
    """A call waiting for a human's decision, with its turn (``Tooltrail.waiting_approvals``)."""

    turn_id: str


class AgentHandle:
    """A started agent run."""

    def __init__(self, handle: WorkflowHandle[Any, AgentRunOutput]) -> None:
        """Wrap a workflow handle."""
        self._handle = handle

    @property
    def run_id(self) -> str:
        """The run id (the workflow id; also the conversation's id)."""
        return self._handle.id

    async def progress(self) -> AgentProgress:
        """How far the run is (turns so far, tokens spent, what it is doing)."""
        progress: AgentProgress = await self._handle.query("progress", result_type=AgentProgress)
        return progress

    async def cancel(self) -> None:
        """Request cancellation; the turn in flight is cancelled too."""
        await self._handle.cancel()

    async def result(self) -> AgentRunOutput:
        """Wait for the run's final answer.

        Raises:
            LoopDetected: a turn was stopped by the loop detector.
            ToolRecoveryExhausted: a call of a turn hit the retry ceiling.
            TurnCancelled: the run was cancelled.
            TurnFailed: the run failed for another reason (e.g. the model refused a request).
        """
        try:
            output: AgentRunOutput = await wait_for_result(self._handle)
        except WorkflowFailureError as failure:
            raise turn_error(failure, self.run_id) from failure
        return output
