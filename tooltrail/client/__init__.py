"""The client API: start turns, wait for their results, read the audit trail and memory.

``local(host)`` brings up everything in-process (the embedded Temporal dev server, a worker,
the SQLite audit database); ``connect(...)`` talks to an existing deployment, whose workers
run ``tooltrail worker``. The client runs no tool code: the workers decide everything about
the tools (``tooltrail.turn.prepare``), so ``connect()`` needs no host.

May import: every layer below it (ground, ``core``, ``tools``, ``llm``, ``db``, ``pipeline``,
``runtime``, ``ops``); only the command line imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tooltrail.core.config import RunConfig
from tooltrail.core.messages import Message
from tooltrail.core.results import ToolCall, ToolDispatchResult
from tooltrail.core.signatures import ApprovalStatement, SignedApproval, arguments_digest
from tooltrail.core.text import nesting_exceeds, too_many_calls
from tooltrail.core.wire import (
    AgentCarry,
    AgentProgress,
    AgentRunInput,
    AgentRunOutput,
    ApprovalInput,
    AuditEvent,
    AuthorizeInput,
    AuthorizeOutcome,
    CloseSessionInput,
    MemoryEntry,
    ModelSettings,
    PendingApproval,
    ShadowPlan,
    TurnInput,
    TurnOutput,
    TurnRecord,
    TurnRun,
    WorkerCatalog,
)
from tooltrail.db.approvals import (
    RejectedApproval,
    list_rejections,
    record_rejection,
)
from tooltrail.db.runs import RunLink, list_run_links, list_run_turns
from tooltrail.db.store import AuditStore, TurnSummary
from tooltrail.errors import (
    ApprovalRejected,
    ConfigurationError,
    LoopDetected,
    ToolRecoveryExhausted,
    TurnCancelled,
    TurnError,
    TurnFailed,
)
from tooltrail.ops.approval_history import ApprovalRecord, approval_history
from tooltrail.ops.approver_keys import load_approver_key, sign_statement
from tooltrail.ops.forks import start_fork
from tooltrail.ops.reruns import RecordedTurn, RerunReport, compare, load_turn
from tooltrail.ops.verify import VerifyReport, verify_turn
from tooltrail.pipeline.directory import registry_fingerprint, watch_registry_peers
from tooltrail.pipeline.host import Host
from tooltrail.runtime.embedded import DEV_SERVER_ARGS, start_dev_server
from tooltrail.runtime.reconciler import ReconcileReport, background_reconciliation, reconcile
from tooltrail.runtime.versioning import eager_start_allowed
from tooltrail.runtime.worker import build_worker, open_deployment, settings_client_options
from tooltrail.settings import Settings
from tooltrail.telemetry import ensure_configured
from tooltrail.tools import Tool, ToolRegistry, UnknownToolError
from tooltrail.tools.access import AccessDecision
from tooltrail.tools.scratch import ScratchDirs

__all__ = [
    "AgentHandle",
    "StuckTurn",
    "Tooltrail",
    "TurnHandle",
    "TurnResult",
    "WaitingApproval",
    "connect",
    "local",
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
        statement = ApprovalStatement(
            approver=answer.by,
            turn_id=self.turn_id,
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


# How many turns ``waiting_approvals`` asks at once, and how long one may take to answer (a
# query needs a worker of the turn's queue; with none, it would wait for the server's limit).
_APPROVAL_QUERIES = 16
_APPROVAL_QUERY_TIMEOUT_S = 10.0


MAX_START_BYTES = 2 * 1024 * 1024
"""The largest turn input ``start_turn`` sends: Temporal's default payload limit (2 MiB, also
Temporal Cloud's); a bigger one is refused before any RPC."""


def _too_large(size: int) -> str:
    return (
        f"the turn's calls are too large to start it ({size} bytes; Temporal accepts "
        "at most 2 MiB per payload): send large data by reference, not in arguments"
    )


_ID_LENGTH = 255
"""The audit database's id columns (``turn``, ``session_state``, ...) hold this many characters."""


def _check_id(kind: str, value: str) -> None:
    """Refuse an id the audit database could not store as it is, before anything starts.

    Session and turn ids come from the host (never the model), and name rows, scratch
    directories and workflows: a clear error beats a turn whose trail cannot be written.
    """
    if len(value) > _ID_LENGTH or "\x00" in value or not value:
        shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
        raise ConfigurationError(
            f"{kind} {shown} cannot be used: ids must be 1 to {_ID_LENGTH} characters "
            f"without NUL bytes ({len(value)} given)"
        )


class StuckTurn(BaseModel):
    """A turn whose workflow task failed again and again."""

    turn_id: str
    attempts: int
    """Workflow task attempts so far."""
    started_at: datetime


def _encodable(call: ToolCall) -> ToolCall:
    """Hand arguments nested too deeply for Temporal's payload codecs over as raw text.

    The workflow then answers the call with a soft ``invalid arguments`` error; as a nested
    mapping they could not be decoded by the worker at all, and the turn would never start.
    """
    if isinstance(call.arguments, str) or not nesting_exceeds(call.arguments):
        return call
    try:
        raw = json.dumps(call.arguments)
    except (ValueError, RecursionError):
        raw = "<arguments nested too deeply to encode>"
    return call.model_copy(update={"arguments": raw})


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


class Tooltrail:
    """The client of a tooltrail deployment (``local`` or ``connect`` create one)."""

    def __init__(
        self,
        client: Client,
        host: Host | None = None,
        *,
        task_queue: str,
        store: AuditStore,
        learn_worker_tools: bool = False,
    ) -> None:
        """Wrap a Temporal client, the host wiring and the audit database.

        The client runs no tool code: the workers decide everything about the tools (see
        ``start_turn``).

        Args:
            client: the Temporal client.
            host: the host wiring; it only serves ``authorize_tool`` (default: no tools).
            task_queue: the task queue of the deployment's workers.
            store: the audit database.
            learn_worker_tools: kept for compatibility; it changes nothing since the workers
                plan turns: a turn that names no tools advertises what its worker serves (an
                MCP server's tools included) either way, and ``worker_tools`` lists them.
        """
        self.client = client
        self.host = Host() if host is None else host
        self.task_queue = task_queue
        self.store = store
        self.sessions: set[str] = set()
        self.learn_worker_tools = learn_worker_tools
        self._worker_catalog: WorkerCatalog | None = None

    async def worker_tools(self, *, refresh: bool = False) -> WorkerCatalog:
        """Return the tools a worker of the task queue serves (asked once, then remembered).

        One short workflow (``ToolCatalogWorkflow``) on the queue; no MCP server is started
        here. Whichever worker answers lists its own tools and those of the queue's live
        workers with other tools (``tooltrail.pipeline.directory``), so any worker's answer stands.

        Raises:
            TurnFailed: no worker answered within 30 s.
        """
        if self._worker_catalog is None or refresh:
            try:
                self._worker_catalog = await self.client.execute_workflow(
                    "ToolCatalogWorkflow",
                    id=f"tool-catalog-{uuid.uuid4()}",
                    task_queue=self.task_queue,
                    result_type=WorkerCatalog,
                    execution_timeout=timedelta(seconds=30),
                )
            except WorkflowFailureError as failure:
                raise TurnFailed(
                    f"no worker of task queue {self.task_queue!r} said which tools it serves: "
                    f"{failure.cause or failure}"
                ) from failure
        return self._worker_catalog

    async def start_turn(
        self,
        calls: Sequence[ToolCall],
        *,
        session_id: str,
        advertised: Iterable[str] | None = None,
        config: RunConfig | None = None,
        turn_id: str | None = None,
        execution_timeout: timedelta | None = None,
        ends_run: bool = False,
        rerun_of: str | None = None,
        shadow: ShadowPlan | None = None,
    ) -> TurnHandle:
        """Start a turn workflow and return its handle.

        Args:
            calls: the model's tool calls, in its order.
            session_id: the session the turn belongs to.
            advertised: the tool names the model was offered (default: the tools the
                deployment's workers offer).
            config: dispatch configuration.
            turn_id: the turn (workflow) id; a new one by default. Ids are never reused.
            execution_timeout: an optional limit for the whole turn.
            ends_run: this turn ends the run (a loop pattern at stop level is then cleared,
                so the session's next run starts clean).
            rerun_of: the turn this one re-runs (see ``rerun``).
            shadow: serve every tool result from a past turn's audit trail (see ``rerun``).

        The worker plans the turn where the tools live (their settings, the parallel-safety
        verdicts, the memoize paths) and reads the session's state itself: the client needs
        no tool code.

        Raises:
            ConfigurationError: ``turn_id`` was already used, the calls are more than
                ``config.max_calls``, or too large to start a turn.
        """
        turn_id = turn_id or f"turn-{uuid.uuid4()}"
        _check_id("session_id", session_id)
        _check_id("turn_id", turn_id)
        config = config or RunConfig()
        if len(calls) > config.max_calls:
            raise ConfigurationError(too_many_calls(len(calls), config.max_calls))
        inp = TurnInput(
            session_id=session_id,
            calls=[_encodable(call) for call in calls],
            advertised=None if advertised is None else list(advertised),
            config=config,
            ends_run=ends_run,
            rerun_of=rerun_of,
            shadow=shadow,
        )
        size = len(inp.model_dump_json().encode("utf-8"))
        if size > MAX_START_BYTES:
            # Refused here: past gRPC's 4 MiB the server would answer with a raw transport
            # error that says nothing about the arguments.
            raise ConfigurationError(_too_large(size))
        try:
            handle = await self.client.start_workflow(
                "TurnWorkflow",
                inp,
                id=turn_id,
                task_queue=self.task_queue,
                result_type=TurnOutput,
                # A turn id names one audit trail: reusing it would mix two turns' events.
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                execution_timeout=execution_timeout,
                # With a worker in this process on this client (tooltrail.local), the server
                # hands it the first workflow task in its answer to the start (~4 ms a turn
                # here); without one, or where the server does not offer it, a plain start.
                # Never with a versioned worker on the client (it would pin the turn to that
                # worker's version, current or not).
                request_eager_start=eager_start_allowed(self.client),
            )
        except WorkflowAlreadyStartedError as exc:
            raise ConfigurationError(
                f"turn id {turn_id!r} was already used; turn ids are never reused"
            ) from exc
        except RPCError as exc:
            # The encoded input (a codec adds bytes) may still pass a server's own limit.
            if "size exceeds limit" not in str(exc) and "larger than max" not in str(exc):
                raise
            raise ConfigurationError(_too_large(size)) from exc
        self.sessions.add(session_id)
        return TurnHandle(handle, self.store)

    async def run_turn(
        self,
        calls: Sequence[ToolCall],
        *,
        session_id: str,
        advertised: Iterable[str] | None = None,
        config: RunConfig | None = None,
        turn_id: str | None = None,
        ends_run: bool = False,
    ) -> TurnResult:
        """Run a turn to completion; see ``start_turn`` and ``TurnHandle.result``."""
        handle = await self.start_turn(
            calls,
            session_id=session_id,
            advertised=advertised,
            config=config,
            turn_id=turn_id,
            ends_run=ends_run,
        )
        return await handle.result()

    async def rerun(
        self,
        turn_id: str,
        *,
        shadow: bool = False,
        session_id: str | None = None,
        config: RunConfig | None = None,
    ) -> RerunReport:
        """Run a past turn's calls again and report where the new turn differs.

        Args:
            turn_id: the past turn.
            shadow: serve every tool result from the past turn's audit trail instead of
                running tools (no side effects; nothing shared changes): the report shows
                where today's code and host wiring decide differently.
            session_id: the session of the new turn (default: the original's).
            config: dispatch configuration (default: the original turn's).

        Raises:
            ConfigurationError: the audit trail has no such turn.
        """
        original = await self._with_full_inputs(await load_turn(self.store, turn_id))
        mode: Literal["rerun", "shadow"] = "shadow" if shadow else "rerun"
        new_turn_id = f"{mode}-{turn_id}-{uuid.uuid4().hex[:8]}"
        plan = (
            ShadowPlan(of_turn=turn_id, attempts=original.attempts, detector=original.detector)
            if shadow
            else None
        )
        handle = await self.start_turn(
            original.calls,
            session_id=session_id or original.turn.session_id,
            advertised=original.advertised,
            config=config or original.config,
            turn_id=new_turn_id,
            rerun_of=turn_id,
            shadow=plan,
        )
        with contextlib.suppress(TurnError):  # a hard error is part of what gets compared
            await handle.result()
        new = await load_turn(self.store, new_turn_id)
        return RerunReport(
            original_turn_id=turn_id,
            new_turn_id=new_turn_id,
            mode=mode,
            divergences=compare(original, new),
        )

    async def _with_full_inputs(self, original: RecordedTurn) -> RecordedTurn:
        """Put back the arguments the trail only noted (over 64 KB), from the turn's history.

        Raises:
            ConfigurationError: the history is gone (retention) or does not hold the call.
        """
        if not original.cut_inputs:
            return original
        turn_id = original.turn.turn_id
        try:
            history = await self.client.get_workflow_handle(turn_id).fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            [inp] = await self.client.data_converter.decode(started.input.payloads, [TurnInput])
        except (RPCError, ValueError, IndexError, TypeError) as exc:
            raise ConfigurationError(
                f"turn {turn_id!r}: the arguments of calls {original.cut_inputs} are too large "
                "for the audit trail and only in the turn's Temporal history, which cannot be "
                f"read ({exc}); the turn cannot be run again"
            ) from exc
        full = {call.id: call for call in inp.calls}
        missing = [call_id for call_id in original.cut_inputs if call_id not in full]
        if missing:
            raise ConfigurationError(
                f"turn {turn_id!r}: the history has no arguments for calls {missing}"
            )
        calls = [full[c.id] if c.id in original.cut_inputs else c for c in original.calls]
        return original.model_copy(update={"calls": calls})

    async def start_agent(
        self,
        messages: Sequence[Message] | str,
        *,
        session_id: str,
        model: ModelSettings | str | None = None,
        system: str | None = None,
        config: RunConfig | None = None,
        max_turns: int = 10,
        run_id: str | None = None,
        turns_per_segment: int = 20,
        local_model: bool = False,
    ) -> AgentHandle:
        """Start a durable agent run: model turn after model turn until the model is done.

        Args:
            messages: the opening messages, or the user's prompt as text.
            session_id: the session (loop window, scratch directory) of the run.
            model: the model name or settings (default: the worker's model client default).
            system: a system prompt to put first.
            config: dispatch configuration of every turn.
            max_turns: stop after this many model turns.
            run_id: the run (workflow and conversation) id; a new one by default.
            turns_per_segment: continue-as-new after this many turns (history stays small).
            local_model: ask the model in a Temporal *local activity*, in the worker that
                runs the turn: each model turn saves a server round trip and a workflow task
                (the model's answer is recorded in the history all the same). The trade-off:
                no heartbeats (the 10-minute timeout bounds a hung call, and a cancellation
                reaches a call in flight only at the next workflow task heartbeat, up to
                ~8 s later), a call whose worker is lost is made again by the next worker
                (the stored answer is reused when it was stored), retries back off in the worker
                (``MODEL_RETRY_POLICY`` waits at most 30 s), and a call longer than the
                workflow task timeout (10 s) keeps the task alive with a heartbeat task every
                few seconds, each a few events in the history. For fast models; slow
                generations are better off as the default, a regular activity.
        """
        opening = [Message.user(messages)] if isinstance(messages, str) else list(messages)
        if system is not None:
            opening.insert(0, Message.system(system))
        settings = (
            ModelSettings(model=model) if isinstance(model, str) else (model or ModelSettings())
        )
        config = config or RunConfig()
        run_id = run_id or f"run-{uuid.uuid4()}"
        _check_id("session_id", session_id)
        _check_id("run_id", run_id)
        inp = AgentRunInput(
            session_id=session_id,
            messages=opening,
            settings=settings,
            config=config,
            max_turns=max_turns,
            turns_per_segment=turns_per_segment,
            local_model=local_model,
            # Each turn reads the session's state itself (see ModelPhase).
            carry=AgentCarry(new_messages=opening),
        )
        handle = await self.client.start_workflow(
            "AgentRunWorkflow",
            inp,
            id=run_id,
            task_queue=self.task_queue,
            result_type=AgentRunOutput,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            request_eager_start=eager_start_allowed(self.client),  # as for a turn
        )
        self.sessions.add(session_id)
        return AgentHandle(handle)

    async def run_agent(
        self, messages: Sequence[Message] | str, *, session_id: str, **options: Any
    ) -> AgentRunOutput:
        """Run an agent to its final answer; see ``start_agent``."""
        handle = await self.start_agent(messages, session_id=session_id, **options)
        return await handle.result()

    async def fork_agent(
        self,
        run_id: str,
        *,
        from_turn: int,
        message: str | None = None,
        new_run_id: str | None = None,
        session_id: str | None = None,
        model: ModelSettings | str | None = None,
        config: RunConfig | None = None,
        max_turns: int | None = None,
    ) -> AgentHandle:
        """Start a new run from turn ``from_turn`` of an agent run (time travel, audited).

        The new run's conversation is a copy of the original's up to turn ``from_turn``
        (0-based, as in turn ids): its first model call asks turn ``from_turn`` again. Both
        runs' trails record the fork (``tooltrail audit show RUN``, ``run_links``). The
        model settings, configuration and tools are the original's when its history can
        still be read (else the defaults); see ``tooltrail.ops.forks``.

        Args:
            run_id: the run to fork (it may be running or finished).
            from_turn: the turn to start again from (0 to the run's last answered turn).
            message: replaces the text of the last user message of the copy.
            new_run_id: the new run's id (a new one by default).
            session_id: the new run's session (default: its run id; a fork does not share
                the original's loop window).
            model: the model name or settings (default: the original's).
            config: the dispatch configuration (default: the original's).
            max_turns: at most this many turns of the new run (default: the original's
                bound on its turn numbers).

        Raises:
            ConfigurationError: no such run, or it has no turn ``from_turn``.
        """
        handle = await start_fork(
            self.client,
            self.store,
            task_queue=self.task_queue,
            run_id=run_id,
            from_turn=from_turn,
            message=message,
            new_run_id=new_run_id,
            session_id=session_id,
            model=model,
            config=config,
            max_turns=max_turns,
        )
        return AgentHandle(handle)

    async def run_turns(self, run_id: str) -> list[TurnRecord]:
        """Return the turns of an agent run that asked its model, in the order they started."""
        async with self.store.sessions() as session:
            return await list_run_turns(session, run_id=run_id)

    async def run_links(self, run_id: str) -> list[RunLink]:
        """Return the forks of and from an agent run, oldest first."""
        async with self.store.sessions() as session:
            return await list_run_links(session, run_id=run_id)

    async def stuck_turns(self, *, min_attempts: int = 2, limit: int = 200) -> list[StuckTurn]:
        """Return running turns whose workflow task keeps failing.

        A history that no longer replays, an input that cannot be decoded, a bug: Temporal
        retries such workflow tasks forever, so they are found here instead of going unnoticed.
        """
        stuck = []
        query = 'WorkflowType="TurnWorkflow" AND ExecutionStatus="Running"'
        async for execution in self.client.list_workflows(query, limit=limit):
            description = await self.client.get_workflow_handle(execution.id).describe()
            pending = description.raw_description.pending_workflow_task
            if pending.attempt >= min_attempts:
                stuck.append(
                    StuckTurn(
                        turn_id=execution.id,
                        attempts=pending.attempt,
                        started_at=execution.start_time,
                    )
                )
        return stuck

    async def waiting_approvals(self, *, limit: int = 1000) -> list[WaitingApproval]:
        """Return every call waiting for an approval, across running turns, oldest first.

        Finds running turns with a visibility query and asks each for its
        ``pending_approvals`` (16 at a time): one query per running turn, answered by a
        worker from its cached state (200 running turns took 0.5 s here, 2.5 ms a turn;
        each query is a billable action on Temporal Cloud). Turns that do not answer within
        10 s (no worker on their queue) are logged and left out. Waiting calls are not
        marked in a search attribute: that would need a custom attribute registered in
        every namespace and a workflow change, for a listing operators run by hand.

        Args:
            limit: look at this many running turns at most (newest first).
        """
        query = 'WorkflowType="TurnWorkflow" AND ExecutionStatus="Running"'
        ids = [execution.id async for execution in self.client.list_workflows(query, limit=limit)]
        gate = asyncio.Semaphore(_APPROVAL_QUERIES)
        silent: list[str] = []

        async def ask(turn_id: str) -> list[WaitingApproval]:
            async with gate:
                try:
                    async with asyncio.timeout(_APPROVAL_QUERY_TIMEOUT_S):
                        pending = await self.get_turn(turn_id).pending_approvals()
                except TimeoutError:
                    silent.append(turn_id)
                    return []
                except RPCError:
                    return []  # ended (or was removed) since the listing: nothing waits
            return [WaitingApproval(turn_id=turn_id, **p.model_dump()) for p in pending]

        found = [item for batch in await asyncio.gather(*map(ask, ids)) for item in batch]
        if silent:
            log.warning(
                "%d running turns did not answer within %gs (is a worker polling their task "
                "queue?): %s",
                len(silent),
                _APPROVAL_QUERY_TIMEOUT_S,
                ", ".join(silent),
            )
        far = datetime.max.replace(tzinfo=UTC)
        return sorted(found, key=lambda item: (item.asked_at or far, item.turn_id))

    async def conversation(self, run_id: str) -> list[Message]:
        """Return an agent run's conversation, in order (kept in SQL, not in history)."""
        return await self.store.conversation(run_id)

    def get_turn(self, turn_id: str) -> TurnHandle:
        """Return the handle of an existing turn."""
        return TurnHandle(
            self.client.get_workflow_handle(turn_id, result_type=TurnOutput), self.store
        )

    async def authorize_tool(
        self, name: str, arguments: dict[str, Any] | None = None
    ) -> AccessDecision:
        """Preflight: would the workers' access gate let this call through? Runs nothing.

        A worker of the task queue answers (``AuthorizeToolWorkflow``), with the gate and the
        tools it dispatches with: the client's own ``Host`` may differ from the workers' in a
        ``connect()`` deployment. No guardrail, body, store or audit row is touched.

        Raises:
            UnknownToolError: the workers have no tool of that name.
            TurnFailed: no worker answered within 30 s.
        """
        try:
            outcome: AuthorizeOutcome = await self.client.execute_workflow(
                "AuthorizeToolWorkflow",
                AuthorizeInput(name=name, arguments=arguments),
                id=f"authorize-tool-{uuid.uuid4()}",
                task_queue=self.task_queue,
                result_type=AuthorizeOutcome,
                execution_timeout=timedelta(seconds=30),
            )
        except WorkflowFailureError as failure:
            raise TurnFailed(
                f"no worker of task queue {self.task_queue!r} answered the preflight of "
                f"{name!r}: {failure.cause or failure}"
            ) from failure
        if outcome.unknown:
            raise UnknownToolError(name)
        return AccessDecision(outcome.allowed, outcome.reason)

    async def acknowledge_loop_warning(
        self, session_id: str, pattern: str | None = None
    ) -> list[str]:
        """Acknowledge a session's loop warning (pipeline spec §10.2).

        The warning is the ``warning`` text of a ``loop_detected`` event (and of
        ``on_loop_detected``). Acknowledging puts the most repeated operation of the session's
        window (of ``pattern``, ``{tool}({param})``, when given) into the warned set, from the
        session's next turn on: from then on a different result of that tool and parameter
        counts as progress and flushes the old repetitions.

        Returns:
            The acknowledged patterns; empty when the session has no such operation.
        """
        return await self.store.acknowledge_loop_warning(session_id, pattern)

    async def audit(self, turn_id: str, *, all_runs: bool = False) -> list[AuditEvent]:
        """Return a turn's audit trail, ordered by ``seq``.

        Args:
            turn_id: the turn.
            all_runs: every Temporal run's records (a reset makes a new run), each run's
                ordered by ``seq``, the runs in the order they wrote; by default only the
                run the turn's workflow id ended with (the latest).
        """
        return await self.store.events(turn_id, all_runs=all_runs)

    async def runs(self, turn_id: str) -> list[TurnRun]:
        """Return the Temporal runs of a turn that wrote records, oldest first."""
        return await self.store.runs(turn_id)

    async def reconcile(self, since: datetime | None = None) -> ReconcileReport:
        """Give turns that ended outside tooltrail their true status; return what changed.

        Every turn whose row says ``running`` (started at or after ``since``) is looked up in
        Temporal (one describe each); those Temporal reports closed (terminated, timed out,
        cancelled, failed, completed) move to that status with a ``turn_reconciled`` event.
        Turns Temporal no longer knows (history deleted by retention) are listed in
        ``missing`` and left as they are. See ``tooltrail.runtime.reconciler``.
        """
        return await reconcile(self.client, self.store, since=since)

    async def verify(self, turn_id: str) -> VerifyReport:
        """Check a turn's audit trail against Temporal's history of it; writes nothing.

        The report's ``ok`` is True when they agree; each ``problems`` entry has a ``kind``
        and a ``detail`` (see ``tooltrail.ops.verify``). ``checkable`` is False when the turn
        could not be checked (unknown turn, history deleted by retention, no codec keys).
        Signed approvals are re-checked against the host's approvers.
        """
        return await verify_turn(
            self.client, self.store, turn_id, approvers=self.host.approver_keys()
        )

    async def approval_history(
        self, turn_id: str, *, approvers: Mapping[str, str] | None = None
    ) -> list[ApprovalRecord]:
        """Every decision on a turn's asks and every answer it refused, in time order.

        Args:
            turn_id: the turn.
            approvers: the approvers to re-check signatures with (default: the host's,
                else the settings'), name to base64 public key.
        """
        keys = self.host.approver_keys() if approvers is None else approvers
        events = await self.store.events(turn_id)
        return approval_history(events, await list_rejections(self.store, turn_id), keys)

    async def memory(self, session_id: str) -> list[MemoryEntry]:
        """Return a session's memory entries."""
        return await self.store.memory(session_id)

    async def turns(self, **filters: Any) -> list[TurnSummary]:
        """Return recent turns, newest first.

        Filters: ``session_id``, ``status``, ``tool``, ``since``, ``until``, ``errors_only``,
        ``limit``.
        """
        return await self.store.turns(**filters)

    async def close_session(self, session_id: str) -> bool:
        """End a session on the worker side: its scratch directory is removed (best-effort)."""
        removed: bool = await self.client.execute_workflow(
            "CloseSessionWorkflow",
            CloseSessionInput(session_id=session_id),
            id=f"close-session-{session_id}-{uuid.uuid4()}",
            task_queue=self.task_queue,
            result_type=bool,
        )
        self.sessions.discard(session_id)
        return removed


@contextlib.asynccontextmanager
async def local(
    host: Host | ToolRegistry | list[Tool],
    *,
    database_url: str | None = None,
    task_queue: str = "tooltrail",
    ui: bool = False,
    ui_port: int | None = None,
    port: int | None = None,
    server_db_filename: str | None = None,
    server_args: Sequence[str] = DEV_SERVER_ARGS,
    shutdown_timeout_s: float = 10.0,
    worker: bool = True,
) -> AsyncIterator[Tooltrail]:
    """Run everything in-process: the embedded Temporal dev server, a worker and the database.

    The database (the host's, ``database_url``, or the embedded SQLite file) is migrated on
    start. On exit the worker drains, session scratch directories are removed and the server
    stops.

    Args:
        host: the host wiring (or a registry, or a list of tools).
        database_url: the audit database (default: the host's, else the embedded SQLite file).
        task_queue: the task queue of the embedded worker.
        ui: whether to start the Temporal UI.
        ui_port: the UI's port (default: any free port).
        port: the Temporal frontend's port (default: any free port).
        server_db_filename: keep the server's state in this SQLite file (default: memory).
        server_args: the dev server's own arguments (default: tooltrail's tuning,
            ``DEV_SERVER_ARGS``; ``()`` runs it with Temporal's defaults).
        shutdown_timeout_s: how long the worker may take to stop on exit before it is
            cancelled (a turn whose final audit write is retrying against an unreachable
            database would otherwise hold it for ever; see ``_bounded``).
        worker: run the embedded worker; ``False``: only the server and the client, for
            workers started elsewhere (``tooltrail dev --no-worker``).
    """
    servers: list[WorkflowEnvironment] = []
    telemetry: list[Any] = []

    async def embedded_client(settings: Settings) -> Client:
        # Started once the database is migrated, so a bad database starts no server.
        # A worker runs here: its spans go to the OTEL_* exporters (unless the application
        # installed a tracer provider of its own).
        configured = ensure_configured(settings)
        if configured is not None:
            telemetry.append(configured)
        env = await start_dev_server(
            port=port,
            ui=ui,
            ui_port=ui_port,
            db_filename=server_db_filename,
            extra_args=server_args,
            startup_timeout_s=settings.embedded_startup_timeout_s,
        )
        servers.append(env)
        # The embedded server's client, with the configured codec and tracing.
        options = settings_client_options(settings)
        options.pop("api_key", None)
        options.pop("tls", None)
        return Client(
            env.client.service_client,
            namespace=env.client.namespace,
            data_converter=options["data_converter"],
            interceptors=options.get("interceptors", []),
        )

    try:
        async with open_deployment(
            host,
            task_queue=task_queue,
            database_url=database_url,
            migrate=True,
            client=embedded_client,
        ) as deployment:
            wired, client, store = deployment.host, deployment.client, deployment.store
            scratch = ScratchDirs(wired.scratch_base, enabled=wired.managed_scratch)
            tt = Tooltrail(client, wired, task_queue=task_queue, store=store)
            try:
                async with contextlib.AsyncExitStack() as running:
                    if worker:
                        names = wired.registry.names()
                        for context in (
                            _bounded(
                                build_worker(
                                    client,
                                    wired,
                                    task_queue=task_queue,
                                    store=store,
                                    scratch=scratch,
                                ),
                                shutdown_timeout_s,
                            ),
                            background_reconciliation(client, store, deployment.settings),
                            watch_registry_peers(
                                client, task_queue, registry_fingerprint(names), names
                            ),
                        ):
                            await running.enter_async_context(context)
                    yield tt
            finally:
                for session_id in tt.sessions:
                    scratch.remove(session_id)
    finally:
        for env in servers:
            await env.shutdown()
        for configured in telemetry:
            configured.flush()  # the providers are global: flushed, not shut down


@contextlib.asynccontextmanager
async def _bounded(running: Worker, timeout_s: float) -> AsyncIterator[Worker]:
    """Run a worker; on exit give its shutdown ``timeout_s``, then cancel it.

    A worker's shutdown waits for the workflow tasks it holds, and a turn's final audit write
    is a local activity that retries inside its workflow task until the database answers:
    with the database down, shutdown would wait for ever. Cancelled, the worker lets go of
    the task; the server hands it to the next worker of the queue, which replays the turn
    and writes its records then (with an embedded server in memory there is no next worker:
    the turn, its history and the unwritten records end with the process).
    """
    task = asyncio.create_task(running.run(), name="tooltrail-local-worker")
    try:
        yield running
    finally:
        stopping = asyncio.create_task(running.shutdown())
        done, _ = await asyncio.wait([stopping], timeout=timeout_s)
        if not done:
            log.warning(
                "the worker did not stop within %gs (a workflow task is still busy, e.g. an "
                "audit write retrying against an unreachable database); cancelling it",
                timeout_s,
            )
            for pending in (task, stopping):
                pending.cancel()
        await asyncio.wait([task, stopping])
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("the worker stopped with an error: %s", task.exception())


@contextlib.asynccontextmanager
async def connect(
    host: Host | ToolRegistry | list[Tool] | None = None,
    *,
    temporal_address: str | None = None,
    namespace: str | None = None,
    task_queue: str | None = None,
    database_url: str | None = None,
    learn_worker_tools: bool | None = None,
) -> AsyncIterator[Tooltrail]:
    """Connect to an existing deployment (workers run ``tooltrail worker``).

    The client needs no tools: the workers decide what they offer and how each call runs.
    ``host``, if given, serves ``authorize_tool`` and its ``database_url``. Options default
    to the settings (``TOOLTRAIL_*`` environment variables); ``learn_worker_tools`` (default:
    whether the settings list MCP servers) is ``Tooltrail``'s.

    Raises:
        DatabaseSchemaError: the database is not migrated (run ``tooltrail db upgrade``).
    """
    async with open_deployment(
        host,
        temporal_address=temporal_address,
        namespace=namespace,
        task_queue=task_queue,
        database_url=database_url,
    ) as deployment:
        yield Tooltrail(
            deployment.client,
            deployment.host,
            task_queue=deployment.task_queue,
            store=deployment.store,
            learn_worker_tools=(
                bool(deployment.settings.mcp_servers)
                if learn_worker_tools is None
                else learn_worker_tools
            ),
        )
