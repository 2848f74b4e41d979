"""``Tooltrail``, the client of a deployment: start turns and agent runs, read what they left.

With the checks ``start_turn`` makes before anything is sent (ids the audit database can hold,
inputs Temporal accepts) and ``StuckTurn``, what ``stuck_turns`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from tooltrail.client._handles import AgentHandle, TurnHandle, TurnResult, WaitingApproval
from tooltrail.core.config import RunConfig
from tooltrail.core.messages import Message
from tooltrail.core.results import ToolCall
from tooltrail.core.text import encodable_call, too_many_calls
from tooltrail.core.wire import (
    SESSION_MEMO,
    AgentCarry,
    AgentRunInput,
    AgentRunOutput,
    AuditEvent,
    AuthorizeInput,
    AuthorizeOutcome,
    CloseSessionInput,
    MemoryEntry,
    ModelSettings,
    ShadowPlan,
    TurnInput,
    TurnOutput,
    TurnRecord,
    TurnRun,
    WorkerCatalog,
)
from tooltrail.db.approvals import list_rejections
from tooltrail.db.model_calls import ModelCall, list_model_calls
from tooltrail.db.runs import RunLink, list_run_links, list_run_turns
from tooltrail.db.store import AuditStore, TurnSummary
from tooltrail.errors import ConfigurationError, TurnError, TurnFailed
from tooltrail.ops.approval_history import ApprovalRecord, approval_history
from tooltrail.ops.forks import start_fork
from tooltrail.ops.reruns import RecordedTurn, RerunReport, compare, load_turn
from tooltrail.ops.verify import VerifyReport, verify_turn
from tooltrail.pipeline.host import Host
from tooltrail.pipeline.middleware import RedactingMiddleware
from tooltrail.runtime.reconciler import ReconcileReport, host_redactors, reconcile
from tooltrail.runtime.versioning import eager_start_allowed
from tooltrail.tools import UnknownToolError
from tooltrail.tools.access import AccessDecision

__all__ = ["MAX_START_BYTES", "StuckTurn", "Tooltrail"]

log = logging.getLogger("tooltrail.client")

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
            # Arguments nested too deep for the payload codecs travel as their JSON text (the
            # turn answers them "nested deeper than 64 levels"): as a mapping, the worker
            # could not decode the turn's input, and the turn would never start.
            calls=[encodable_call(call) for call in calls],
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
                # The session, where Temporal's listing shows it (``audit verify --session``
                # finds the session's turns without reading each history).
                memo={SESSION_MEMO: inp.session_id},
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

    async def model_calls(
        self, turn_id: str | None = None, *, run_id: str | None = None
    ) -> list[ModelCall]:
        """Return every model call attempt of a turn or of an agent run, failed ones included.

        Each carries its provider, model, request digest, latency, tokens, stop reason,
        error and estimated cost (``TOOLTRAIL_MODEL_PRICES``); ``totals(calls)`` of
        ``tooltrail.db.model_calls`` sums them.
        """
        async with self.store.sessions() as session:
            return await list_model_calls(session, turn_id=turn_id, run_id=run_id)

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
        Turns Temporal does not know (history deleted by retention, an in-memory server that
        died) move to ``lost``, with a ``turn_reconciled`` event, and are listed in
        ``missing``. See ``tooltrail.runtime.reconciler``.

        Turns of this task queue that Temporal closed with no row at all (ended before their
        first write: terminated, timed out, their worker lost) are rebuilt from their
        histories, every record marked ``rebuilt``; they are listed in ``rebuilt``. Without
        ``since`` the closed turns listed are those since the last reconciliation's watermark
        (kept in the database); with it, those started since then. See
        ``tooltrail.runtime.reconciler``.
        """
        return await reconcile(
            self.client,
            self.store,
            since=since,
            task_queue=self.task_queue,
            redactors=host_redactors(self.host),
        )

    async def verify(self, turn_id: str) -> VerifyReport:
        """Check a turn's audit trail against Temporal's history of it; writes nothing.

        The report's ``ok`` is True when they agree; each ``problems`` entry has a ``kind``
        and a ``detail`` (see ``tooltrail.ops.verify``). ``checkable`` is False when the turn
        could not be checked (unknown turn, history deleted by retention, no codec keys).
        Signed approvals are re-checked against the host's approvers, and the inputs Temporal
        ran are redacted with the host's ``RedactingMiddleware`` rules before they are compared
        with the trail's (which stores them redacted).
        """
        return await verify_turn(
            self.client,
            self.store,
            turn_id,
            approvers=self.host.approver_keys(),
            redactors=[m for m in self.host.middleware if isinstance(m, RedactingMiddleware)],
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
