"""The tool activity: one attempt of one call, with exception isolation.

A tool's failure is a *result*, never raised out of the activity, so Temporal never retries
it; only the workflow's recovery loop runs a call again. Anything this activity raises is an
infrastructure failure (an unreachable database, a lost worker), which Temporal retries as
the same attempt. (The turn's audit records travel apart, in batches: ``Recorder`` writes
them for the ``tooltrail.audit.record`` local activity.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, assert_never

from pydantic_core import to_jsonable_python
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from tooltrail.activities.body_journal import AttemptJournal, read_journal, until_written
from tooltrail.activities.recorder import Recorder
from tooltrail.core.breaker import CircuitBreaker
from tooltrail.core.envelopes import seal_outcome
from tooltrail.core.hooks import (
    PostToolUseContext,
    PreToolUseContext,
    run_post_hooks,
    run_pre_hooks,
)
from tooltrail.core.memoize import MemoEntry, MemoizingMiddleware, with_cached_marker
from tooltrail.core.proofs import check_approval_proof
from tooltrail.core.signatures import arguments_digest
from tooltrail.core.text import (
    BREAKER_OPEN,
    MEMORY_FIELD_LIMIT,
    NOT_RECORDED,
    not_found,
    render_text,
    stable_hash,
)
from tooltrail.core.wire import (
    ATTEMPT_TIMED_OUT,
    LOCAL_ATTEMPT_MARGIN,
    TOOL_EXECUTE,
    AttemptOutcome,
    BreakerRefused,
    ExecuteAttempt,
    HookRefused,
    HooksPassed,
    MemoSeen,
    Ran,
    ShadowServed,
)
from tooltrail.db.health import HealthStore
from tooltrail.logs import call_context
from tooltrail.pipeline.directory import TOOL_ON_PEER, RegistryDirectory
from tooltrail.pipeline.dispatcher import NullAuditLog, ToolDispatcher
from tooltrail.pipeline.heartbeats import BODY_STARTED, attempt_details, current_details
from tooltrail.pipeline.middleware import (
    Middleware,
    MiddlewareCall,
    MiddlewareResult,
    Next,
    ToolCallMiddleware,
    run_pipeline,
)
from tooltrail.telemetry import record_breaker_state, record_call, record_retry, tool_span
from tooltrail.tools import ArgumentsRejected, ToolContext, ToolRegistry
from tooltrail.tools.scratch import ScratchDirs

__all__ = [
    "BODY_STARTED",
    "REFUSED_BEFORE_BODY",
    "MemoServing",
    "ToolActivities",
    "heartbeating",
    "interrupted_text",
    "reached_body",
]

log = logging.getLogger("tooltrail.tool")

_Answer = Ran | ShadowServed | HookRefused | HooksPassed | BreakerRefused
"""The kinds of ``AttemptOutcome`` this activity answers with (the others are the workflow's)."""

BREAKER_OPEN_TEXT = BREAKER_OPEN
"""The soft result of a call refused by an open circuit breaker (spec §11.3)."""


def interrupted_text(name: str) -> str:
    """Soft text for a ``retry_on_interrupt=False`` tool whose worker was lost mid-body."""
    return (
        f"tool '{name}' was interrupted before it reported a result; "
        "it may or may not have taken effect"
    )


@contextlib.asynccontextmanager
async def heartbeating(*details: object, at_once: bool = True) -> AsyncIterator[None]:
    """Heartbeat in the background while the block runs.

    Heartbeats are how Temporal notices a lost worker and delivers cancellation. Without
    ``details``, each beat sends the running tool attempt's
    (``tooltrail.pipeline.heartbeats``), so a journal recorded inside the block rides along. With
    ``at_once`` the first one goes out before the block starts, so a
    retried attempt can tell that the block had begun; without it the first beat waits a
    third of the heartbeat timeout (a heartbeat is a call into the SDK's core: a no-op
    tool's attempt would spend more time on it than on the tool). A local activity has no
    heartbeats (its worker is the workflow's, and its timeout bounds it): the block just runs.
    """
    if activity.info().is_local:
        yield
        return

    def send() -> None:
        if activity.is_cancelled():
            return  # the server gave up on the attempt (a body running on): nobody listens
        current = current_details()
        if details or current is None:
            activity.heartbeat(*details)
        else:
            activity.heartbeat(*current.details())

    if at_once:
        send()
    timeout = activity.info().heartbeat_timeout
    interval = max(0.1, timeout.total_seconds() / 3) if timeout else 10.0

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            send()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


REFUSED_BEFORE_BODY = frozenset({"access_denied", "guardrail_violation", "idempotency_busy"})
"""Dispatch statuses of calls the registry core refused before the tool's body (GIA §2)."""


class MemoServing:
    """The memoize layer's place in one attempt's pipeline, when it is not registered first.

    Serves the request's hit there (the layers before it handle the cached result, those
    after it and the core never run), and otherwise notes what came back from the inner
    layers, which is what the workflow caches (spec §12: observable order = registration
    order). One per attempt, so concurrent attempts never share it.
    """

    def __init__(self, inp: ExecuteAttempt) -> None:
        """Take the request's hit, if it carries one."""
        self.serve: MemoEntry | None = inp.memo
        self.tool_name = inp.tool_name
        self.arguments = inp.arguments
        self.served = False
        self.seen: MiddlewareResult | None = None

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Serve the hit when the call reaches the layer as it was cached, else pass through."""
        entry = self.serve
        if entry is not None and (call.tool_name, call.arguments) == (
            self.tool_name,
            self.arguments,
        ):
            self.served = True
            return MiddlewareResult(
                output=with_cached_marker(entry.output),
                is_error=False,
                duration_ms=entry.duration_ms,  # the original call's, as a hit replays it
                resolved_tool_name=entry.resolved_tool_name,
                display_hint=entry.display_hint,
            )
        result = await call_next(call)
        if not result.is_error:
            self.seen = result
        return result


def reached_body(outcome: Ran) -> bool:
    """Whether an attempt's outcome is the tool's own, so it counts toward its breaker.

    **Decision (ours), a departure from pipeline spec §11.3's letter:** a call the access gate,
    the guardrails or a busy idempotency claim refused never reached the tool, so it says
    nothing of the tool's health. Counting it would let three malformed calls of one session
    open the shared breaker for every session and worker.
    """
    if outcome.memo_served:
        return False  # a memoize hit: the tool did not run, and says nothing of its health
    status = (outcome.dispatch or {}).get("status")
    return status not in REFUSED_BEFORE_BODY


ORPHAN_RESULT_KEEP_S = 600.0
"""How long a body the server gave up on keeps its result for the attempt's retry."""


async def _cancel_if_closed(task: asyncio.Task[Ran], info: activity.Info) -> None:
    """Cancel a body the server no longer knows unless a retry of its attempt is coming.

    "Not found" says the server stopped waiting for this Temporal attempt: its heartbeats came
    late (a retry follows, which adopts the body's result), its own time was up and it is not
    retried, or the workflow closed. Only in the first case is the body left to run: the
    workflow's pending activity shows the retry.
    """
    try:
        handle = activity.client().get_workflow_handle(
            info.workflow_id or "", run_id=info.workflow_run_id
        )
        described = await handle.describe()
    except Exception:  # cannot tell: a running body is left to finish
        log.debug("cannot describe workflow %r", info.workflow_id, exc_info=True)
        return
    retried = described.status == WorkflowExecutionStatus.RUNNING and any(
        pending.activity_id == info.activity_id and pending.attempt > info.attempt
        for pending in described.raw_description.pending_activities
    )
    if not retried:
        task.cancel()


def _body_key(info: activity.Info) -> tuple[str, str, str]:
    return (info.workflow_id or "", info.workflow_run_id or "", info.activity_id or "")


def _started_marks(info: activity.Info) -> list[dict[str, Any]]:
    """The attempts that started a body, as an earlier attempt's heartbeat details name them."""
    for detail in info.heartbeat_details or ():
        if isinstance(detail, dict) and isinstance(detail.get("started"), list):
            return [
                {"temporal_attempt": int(m["temporal_attempt"]), "worker": m.get("worker")}
                for m in detail["started"]
                if isinstance(m, dict) and isinstance(m.get("temporal_attempt"), int)
            ]
    return []


async def _within_time(run: Coroutine[Any, Any, _Answer]) -> _Answer:
    """Run an attempt; one that runs out of its time fails for good, ``ATTEMPT_TIMED_OUT``.

    A local attempt bounds itself to its time (its start-to-close timeout less
    ``LOCAL_ATTEMPT_MARGIN``): the SDK would retry its own timeout of a local activity and
    start the hung body again. A regular attempt's timeout is the server's, which the retry
    policy keeps from retrying; a cancellation the SDK made for a timeout leaves the same way.
    """
    info = activity.info()
    limit = None
    if info.is_local and info.start_to_close_timeout is not None:
        limit = max(0.0, (info.start_to_close_timeout - LOCAL_ATTEMPT_MARGIN).total_seconds())
    timed_out = ApplicationError(
        "the attempt ran out of its time", type=ATTEMPT_TIMED_OUT, non_retryable=True
    )
    try:
        async with asyncio.timeout(limit) as scope:
            return await run
    except TimeoutError:
        if not scope.expired():
            raise
        raise timed_out from None
    except asyncio.CancelledError:
        details = activity.cancellation_details()
        if details is None or not details.timed_out:
            raise
        raise timed_out from None


class ToolActivities:
    """Runs tool attempts; one instance per worker."""

    def __init__(
        self,
        registry: ToolRegistry,
        recorder: Recorder,
        scratch: ScratchDirs,
        *,
        noop_reflector: bool = True,
        hooks: Sequence[object] = (),
        hook_timeout_s: float = 30.0,
        middleware: Sequence[Middleware] = (),
        breaker: CircuitBreaker | None = None,
        dispatcher: ToolDispatcher | None = None,
        worker_identity: str = "",
        directory: RegistryDirectory | None = None,
        worker_keys: Mapping[str, bytes] | None = None,
    ) -> None:
        """Wire the registry, the audit recorder and the scratch directories.

        Args:
            registry: the tools.
            recorder: writes audit records and delivers them to observers.
            scratch: session scratch directories.
            noop_reflector: whether the host's reflector is the ``NoopReflector``; the
                outcome tells the workflow, which then skips the reflector round trip.
            hooks: pre/post tool hooks, in registration order.
            hook_timeout_s: how long one hook call may take.
            middleware: the layers around the registry core; the first is the outermost.
            breaker: the circuit breaker configuration, or ``None`` for no health registry.
            dispatcher: the worker's dispatcher (access gate, guardrails, idempotency);
                default: one on ``registry`` with no gate and an in-memory store.
            worker_identity: this worker's Temporal identity, named on attempt records.
            directory: the registries of the worker's task queue; an attempt of a tool this
                worker lacks and a live peer has is refused for that peer (``_route``).
            worker_keys: the deployment's worker keys, which check the approval proof of an
                attempt that skips the pre-tool hooks (``tooltrail.core.proofs``).
        """
        self.registry = registry
        self.recorder = recorder
        self.scratch = scratch
        self.reflector: Literal["noop", "custom"] = "noop" if noop_reflector else "custom"
        self.hooks = list(hooks)
        self.hook_timeout_s = hook_timeout_s
        self.middleware = list(middleware)
        self.core = ToolCallMiddleware(dispatcher or ToolDispatcher(registry, audit=NullAuditLog()))
        self.health = None if breaker is None else (HealthStore(recorder.store), breaker)
        self.worker_identity = worker_identity
        self.directory = directory
        self._routes_warned: set[tuple[str, str]] = set()
        self.worker_keys = dict(worker_keys or {})
        # Bodies of regular attempts by (workflow, run, activity id): a retry of an attempt
        # whose body still runs here waits for it (``_body``, ``_earlier_run``).
        self._bodies: dict[tuple[str, str, str], tuple[int, asyncio.Task[Ran]]] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    @activity.defn(name=TOOL_EXECUTE)
    async def execute(self, inp: ExecuteAttempt) -> AttemptOutcome:
        """Run one attempt: pre hooks, breaker gate, body, post hooks (a failure is a result).

        Raises:
            ApplicationError: of type ``TOOL_ON_PEER`` (non-retryable), when this worker lacks
                the tool and a live peer of its task queue has it (the turn sends it there);
                of type ``ATTEMPT_TIMED_OUT`` (non-retryable), when the attempt ran out of
                its time.
        """
        info = activity.info()
        if inp.tool_name not in self.registry:
            await self._route(inp, info)
        if not inp.turn_id:
            # The workflow leaves its own id out (every byte of the input is history).
            inp.turn_id = info.workflow_id or ""
        # What an earlier Temporal attempt of this same attempt did (activities.body_journal).
        journal = AttemptJournal() if info.is_local else read_journal(info.heartbeat_details)
        # Every log line of this attempt names the turn, the call and the attempt; a real
        # attempt (one that may run the tool) has its own span, named after the tool.
        with (
            call_context(inp.turn_id, inp.tool_call_id, inp.attempt),
            tool_span(
                inp.tool_name,
                tool_call_id=inp.tool_call_id,
                session_id=inp.session_id,
                turn_id=inp.turn_id,
                attempt=inp.attempt,
                enabled=not (inp.hooks_only or inp.shadow),
            ) as span,
            attempt_details(journal),
        ):
            outcome = await _within_time(self._run(inp, journal))
            match outcome:
                case Ran() | ShadowServed():
                    span.finish(
                        is_error=outcome.is_error, resolved_tool_name=outcome.resolved_tool_name
                    )
                case HookRefused():
                    span.finish(is_error=True, refused_by="hook")
                case BreakerRefused():
                    span.finish(is_error=True, refused_by="breaker")
                case HooksPassed():
                    span.finish(is_error=False)
                case _:
                    assert_never(outcome)
        if not (inp.hooks_only or inp.shadow):
            if inp.attempt > 0:
                record_retry(inp.tool_name)
            if isinstance(outcome, Ran):
                record_call(outcome.resolved_tool_name, outcome.is_error, outcome.duration_ms)
            else:  # refused by a hook or the breaker: a soft failure that took no time
                record_call(inp.tool_name, True, 0.0)
        # What the workflow knows goes back unsaid (the workflow's open_outcome restores it).
        return seal_outcome(outcome, inp)

    async def _route(self, inp: ExecuteAttempt, info: activity.Info) -> None:
        """Refuse an attempt of a tool this worker lacks for a live peer that has it.

        Before anything else (hooks, the breaker gate, records): the attempt is the peer's.
        An attempt already sent to a tools queue is never sent on again; with no live peer
        that has the tool, the attempt goes on and the core answers "Tool not found".
        """
        directory = self.directory
        if directory is None or info.task_queue != directory.task_queue:
            return
        found = await directory.peer_queue_for(inp.tool_name)
        if found is None:
            return
        queue, theirs = found
        if (inp.tool_name, queue) not in self._routes_warned:
            self._routes_warned.add((inp.tool_name, queue))
            log.warning(
                "TOOL %r IS NOT IN THIS WORKER'S REGISTRY (%s: %s) BUT IN A PEER'S ON TASK "
                "QUEUE %r (%s); its attempts are sent to %r. Run every worker of a queue with "
                "the same tools to avoid the detour.",
                inp.tool_name,
                directory.fingerprint,
                ", ".join(self.registry.names()) or "(none)",
                directory.task_queue,
                ", ".join(theirs),
                queue,
            )
        raise ApplicationError(
            f"tool {inp.tool_name!r} is served by the workers of {queue!r}",
            queue,
            type=TOOL_ON_PEER,
            non_retryable=True,
            # Expected, and said once above: not a failure for the SDK to log with its trace.
            category=ApplicationErrorCategory.BENIGN,
        )

    def _account(self, outcome: Ran) -> None:
        """Name the Temporal attempt and worker that ran the body, and the attempts lost.

        Temporal retries an attempt whose worker was lost: attempts below this one started
        and never reported. Those that heartbeat while their body ran named their worker in
        the heartbeat marks (``_started_list``); the others are lost with no worker known.
        """
        info = activity.info()
        outcome.temporal_attempt = info.attempt
        outcome.worker = self.worker_identity
        if info.attempt <= 1:
            return
        started = {mark["temporal_attempt"]: mark["worker"] for mark in _started_marks(info)}
        outcome.lost_attempts = [
            {"temporal_attempt": number, "worker": started.get(number)}
            for number in range(1, info.attempt)
        ]

    def _started_list(self) -> list[dict[str, Any]]:
        """The attempts that started a body, this one last (the ``started`` heartbeat mark)."""
        info = activity.info()
        marks = [m for m in _started_marks(info) if m["temporal_attempt"] < info.attempt]
        marks.append({"temporal_attempt": info.attempt, "worker": self.worker_identity})
        return marks

    async def _run(self, inp: ExecuteAttempt, journal: AttemptJournal) -> _Answer:
        adopted = None if (inp.hooks_only or inp.shadow) else journal.ran
        if adopted is None and not (inp.hooks_only or inp.shadow):
            adopted = await self._earlier_run(inp)
        if adopted is None:
            before = await self._before_body(inp, journal)
            if before is not None:
                return before
            ran = await self._body(inp)
            self._account(ran)
            # Journaled before anything is written after the body: whatever fails from here
            # on, a Temporal retry adopts this result instead of running the body again.
            journal.record_ran(ran)
            if self.health is not None and reached_body(ran):
                # Recorded once per tooltrail attempt (an adopting retry skips it), and only
                # for an outcome that is the tool's own (``reached_body``).
                await self._record_health(*self.health, ran)
        else:
            log.warning(
                "tool %r: the body already returned in Temporal attempt %d's predecessor; "
                "adopting its result (the body does not run again)",
                inp.tool_name,
                activity.info().attempt,
            )
            ran = adopted
        outcome = await self._written(ran, inp)
        if self.hooks:
            outcome.post_hook_errors = await run_post_hooks(
                self.hooks,
                PostToolUseContext(
                    tool_name=inp.tool_name,
                    input=inp.arguments,
                    output=render_text(ran.output),
                    is_error=outcome.is_error,
                    duration_ms=int(outcome.duration_ms),
                    session_id=inp.session_id,
                    turn_number=inp.turn_number,
                    turn_id=inp.turn_id,
                    tool_call_id=inp.tool_call_id,
                ),
                timeout_s=self.hook_timeout_s,
            )
        return outcome

    async def _before_body(
        self, inp: ExecuteAttempt, journal: AttemptJournal
    ) -> HookRefused | HooksPassed | ShadowServed | BreakerRefused | None:
        """Pre hooks, then the breaker gate; an answer if the body must not run."""
        if self.hooks and not self._approved(inp):
            decision = await run_pre_hooks(
                self.hooks,
                PreToolUseContext(
                    tool_name=inp.tool_name,
                    input=inp.arguments,
                    session_id=inp.session_id,
                    turn_number=inp.turn_number,
                    turn_id=inp.turn_id,
                    tool_call_id=inp.tool_call_id,
                ),
                timeout_s=self.hook_timeout_s,
            )
            if decision is not None:
                # Blocked (or waiting for a human): the tool never runs, no post hooks.
                return HookRefused(hook=decision)
        if inp.hooks_only:
            # The hooks let the attempt through; the workflow refuses it (a loop stop).
            return HooksPassed()
        if inp.shadow:
            # A shadow replay changes nothing shared: no breaker gate or health record, no
            # tool body, no post hooks (user code with side effects); the result comes from
            # the original turn's audit trail, screened by today's access gate and guardrails.
            return await self._shadow_attempt(inp)
        # Once per tooltrail attempt: a Temporal retry of an attempt that passed the gate is
        # the same attempt (a lost half-open probe must not be refused by its own probe).
        if (
            self.health is not None
            and not journal.gate_passed
            and not await self._gate(*self.health, inp.tool_name, journal)
        ):
            return BreakerRefused()
        return None

    async def _body(self, inp: ExecuteAttempt) -> Ran:
        """Run the attempt's pipeline; a run the server gave up on goes on to its end.

        When Temporal stops waiting for an attempt whose worker is alive but behind (its
        heartbeats late: a backlog, a starved loop, a paused process), the SDK cancels the
        activity (``not_found``) and Temporal sends the attempt again. The
        body is not cancelled then: it may be half way through a side effect, and the retry
        would run it a second time. It runs on, and a retry of the same attempt in this
        process waits for it and adopts its result (``_earlier_run``). A cancellation the
        workflow asked for, or a worker shutdown, cancels the body as before.
        """
        info = activity.info()
        if info.is_local:
            return await self._attempt(inp)
        key = _body_key(info)
        task = asyncio.create_task(self._attempt(inp), name=f"tooltrail-body-{inp.tool_name}")
        self._bodies[key] = (info.attempt, task)
        task.add_done_callback(lambda done: self._forget_later(key, done))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            # Not found: the server no longer waits for this attempt (its heartbeats came
            # late) and retries it. A timeout of the attempt's own (start-to-close) is not
            # that: its time is up, and the body is cancelled as before.
            if details is not None and details.not_found:
                if not task.done():
                    # "Not found" also means the attempt's time was up, or the workflow
                    # closed: then nobody adopts the result, and the body is cancelled.
                    watch = asyncio.create_task(_cancel_if_closed(task, info))
                    self._watchers.add(watch)
                    watch.add_done_callback(self._watchers.discard)
                    log.warning(
                        "tool %r: Temporal gave up on attempt %d of call %r while its body "
                        "runs (this worker's heartbeats were late); the body goes on, and the "
                        "attempt's retry in this process adopts its result",
                        inp.tool_name,
                        info.attempt,
                        inp.tool_call_id,
                    )
                raise
            # Asked by the workflow (or a shutdown): the body is cancelled as it always was,
            # and the attempt ends as the body does (a sync body sees the flag and returns).
            task.cancel()
            return await task

    def _forget_later(self, key: tuple[str, str, str], task: asyncio.Task[Ran]) -> None:
        """Keep a finished body's result for a retry a while, then let it go."""
        if not task.cancelled():
            task.exception()  # retrieved: an orphan's failure is the retry's business

        def forget() -> None:
            if self._bodies.get(key, (0, None))[1] is task:
                del self._bodies[key]

        asyncio.get_running_loop().call_later(ORPHAN_RESULT_KEEP_S, forget)

    async def _earlier_run(self, inp: ExecuteAttempt) -> Ran | None:
        """The result of an earlier Temporal attempt's body in this process, waited for.

        ``None`` when there is none, or when it ended without a result (cancelled, or a
        failure of the pipeline itself): then this attempt runs the body.
        """
        info = activity.info()
        if info.is_local or info.attempt <= 1:
            return None
        found = self._bodies.get(_body_key(info))
        if found is None:
            return None
        number, task = found
        if not task.done():
            log.warning(
                "tool %r: Temporal attempt %d of call %r finds attempt %d's body still running "
                "in this worker; waiting for it instead of running the body again",
                inp.tool_name,
                info.attempt,
                inp.tool_call_id,
                number,
            )
            async with heartbeating():
                with contextlib.suppress(BaseException):
                    await asyncio.shield(task)
            if activity.is_cancelled():
                raise asyncio.CancelledError
        if task.cancelled() or task.exception() is not None:
            return None
        ran = task.result()
        self._account(ran)
        # The body ran in the earlier attempt; only the ones before it were lost.
        ran.temporal_attempt = number
        ran.lost_attempts = [a for a in ran.lost_attempts or [] if a["temporal_attempt"] != number]
        log.warning(
            "tool %r: adopting the result of Temporal attempt %d's body (it does not run again)",
            inp.tool_name,
            number,
        )
        return ran

    def _approved(self, inp: ExecuteAttempt) -> bool:
        """Whether the attempt may skip the pre-tool hooks: a proven approval of its call.

        A local activity comes from the workflow code of this worker, which asked for the
        skip only after taking up an approval. A regular one may come from any workflow of
        the namespace: it skips the hooks only with a proof made under the worker key for
        the Temporal run that scheduled it (``activity.info()``, set by the server), this
        call and these arguments. Anything else runs the hooks, as if no approval was said.
        """
        if not inp.skip_pre_hooks:
            return False
        info = activity.info()
        if info.is_local:
            return True
        try:
            digest = arguments_digest(inp.arguments)
        except ValueError:
            digest = ""
        if check_approval_proof(
            self.worker_keys,
            inp.approval_proof,
            workflow_id=info.workflow_id or "",
            run_id=info.workflow_run_id or "",
            tool_call_id=inp.tool_call_id,
            arguments_sha256=digest,
        ):
            return True
        log.warning(
            "call %r of tool %r asks to skip the pre-tool hooks without a valid approval "
            "proof for workflow %r run %r (a foreign workflow, or workers with different "
            "TOOLTRAIL_WORKER_KEYs): the hooks run",
            inp.tool_call_id,
            inp.tool_name,
            info.workflow_id,
            info.workflow_run_id,
        )
        return False

    async def _shadow_attempt(self, inp: ExecuteAttempt) -> ShadowServed:
        def soft(text: str) -> ShadowServed:
            return ShadowServed(
                output=text,
                is_error=True,
                duration_ms=0.0,
                resolved_tool_name=inp.tool_name,
                reflector=self.reflector,
            )

        dispatcher = self.core.dispatcher
        found = dispatcher.lookup(inp.tool_name)
        if found is None:
            return soft(not_found(inp.tool_name, self.registry.names()))
        decision = await dispatcher.access.check(inp.tool_name, found.kind, inp.arguments)
        if not decision.allowed:
            return soft(decision.error_text)
        try:
            found.validate(inp.arguments)
        except ArgumentsRejected as rejected:
            return soft(str(rejected))
        recorded = inp.recorded
        if recorded is None:
            # The original attempt never ran its body (refused, or never reached): what the
            # tool would answer now is unknown, and the report says so (replays.compare).
            return soft(NOT_RECORDED)
        return ShadowServed(
            output=recorded.output,
            is_error=recorded.is_error,
            duration_ms=recorded.duration_ms,
            resolved_tool_name=recorded.resolved_tool_name,
            display_hint=recorded.display_hint,
            reflector=self.reflector,
        )

    async def _claim_check(self, output: str | list[Any], limit: int) -> dict[str, Any]:
        """Keep a large output out of workflow history: store it, pass its key instead.

        The workflow still needs the output's hash (loop detection) and its first
        characters (memory), so those travel with the key.
        """
        encoded = json.dumps(to_jsonable_python(output), ensure_ascii=False)
        if limit <= 0 or len(encoded.encode("utf-8")) <= limit:
            return {"output": output}
        text = render_text(output)
        key = hashlib.sha256(encoded.encode("utf-8")).hexdigest()
        await self.recorder.put_blob(key, to_jsonable_python(output), len(encoded))
        return {
            "output": "",
            "output_ref": key,
            "output_hash": stable_hash(text),
            "output_preview": text[: MEMORY_FIELD_LIMIT + 1],
        }

    async def _dispatch_record(
        self, record: dict[str, Any] | None, inp: ExecuteAttempt
    ) -> dict[str, Any] | None:
        """The dispatch record for the audit trail; a large raw value goes to the database."""
        if record is None:
            return None
        limit = inp.large_output_bytes
        data: dict[str, Any] = dict(record)
        encoded = json.dumps(data.get("value"), ensure_ascii=False)
        if limit > 0 and len(encoded.encode("utf-8")) > limit:
            key = hashlib.sha256(encoded.encode("utf-8")).hexdigest()
            await self.recorder.put_blob(key, data["value"], len(encoded))
            data["value"] = None
            data["value_ref"] = key
        return data

    @staticmethod
    async def _gate(
        health: HealthStore, breaker: CircuitBreaker, tool_name: str, journal: AttemptJournal
    ) -> bool:
        """Step 4: may the requested tool run? The breakers are shared through the database."""
        try:
            allowed, probe = await health.gate(tool_name, breaker)
        except Exception:
            # The breaker protects the downstream service, not the audit trail: with the
            # database unreachable, let the call through rather than stop every tool.
            log.warning(
                "circuit breaker unavailable for %r; allowing the call", tool_name, exc_info=True
            )
            return True
        if allowed:
            # A probe's mark goes out at once: a worker lost right after still leaves it.
            journal.pass_gate(send=probe)
        return allowed

    @staticmethod
    async def _record_health(health: HealthStore, breaker: CircuitBreaker, outcome: Ran) -> None:
        """Step 6d: record the attempt's outcome under the tool that actually ran."""
        try:
            state = await health.record(
                outcome.resolved_tool_name,
                is_error=outcome.is_error,
                duration_ms=outcome.duration_ms,
                config=breaker,
            )
            record_breaker_state(outcome.resolved_tool_name, state)
        except Exception:
            log.warning(
                "health record for %r failed; dropped", outcome.resolved_tool_name, exc_info=True
            )

    def _layers(self, inp: ExecuteAttempt) -> tuple[list[Any], MemoServing | None]:
        """The attempt's layers: a memoize layer not registered first is served in place."""
        layers = list(self.middleware)
        for index, layer in enumerate(layers):
            if isinstance(layer, MemoizingMiddleware) and index > 0:
                memo = MemoServing(inp)
                layers[index] = memo
                return layers, memo
        return layers, None

    @staticmethod
    def _memo_seen(memo: MemoServing | None, limit: int) -> MemoSeen | None:
        """What the workflow may cache; a large output stays out of history (not cached)."""
        if memo is None or memo.served or memo.seen is None:
            return None
        seen = memo.seen
        encoded = json.dumps(to_jsonable_python(seen.output), ensure_ascii=False)
        if limit > 0 and len(encoded.encode("utf-8")) > limit:
            return None
        return MemoSeen(
            output=seen.output,
            duration_ms=round(seen.duration_ms, 3),
            resolved_tool_name=seen.resolved_tool_name,
            display_hint=seen.display_hint,
        )

    async def _attempt(self, inp: ExecuteAttempt) -> Ran:
        """Run the middleware pipeline around the registry core, heartbeating throughout."""
        tool = self.registry.lookup(inp.tool_name)
        info = activity.info()
        if (
            tool is not None
            and info.attempt > 1
            and not tool.retry_on_interrupt
            and BODY_STARTED in (info.heartbeat_details or ())
        ):
            # The worker was lost while the body ran: say so instead of running it again.
            return Ran(
                output=interrupted_text(tool.name),
                is_error=True,
                duration_ms=0.0,
                resolved_tool_name=tool.name,
                reflector=self.reflector,
            )
        call = MiddlewareCall(
            tool_name=inp.tool_name,
            arguments=inp.arguments,
            tool_call_id=inp.tool_call_id,
            ctx=ToolContext(
                session_id=inp.session_id,
                turn_id=inp.turn_id,
                tool_call_id=inp.tool_call_id,
                attempt=inp.attempt,
                temp_dir=self.scratch.ensure(inp.session_id),
            ),
            registry_names=tuple(self.registry.names()),
        )
        started_at = datetime.now(UTC)
        # Only a tool that must not run twice needs the "body started" mark before the body.
        at_once = tool is not None and not tool.retry_on_interrupt
        layers, memo = self._layers(inp)
        details = current_details()
        if details is not None:
            details.body_started = True
            if not info.is_local:
                # Which attempts started a body and on which worker, so a retry can account
                # for the lost ones (``_account``); kept with the attempt's other marks.
                details.marks["started"] = self._started_list()
        async with heartbeating(at_once=at_once):
            result = await run_pipeline(layers, self.core, call)
        return Ran(
            output=result.output,
            memo_served=memo is not None and memo.served,
            memo_seen=self._memo_seen(memo, inp.large_output_bytes),
            started_at=started_at,
            finished_at=datetime.now(UTC),
            is_error=result.is_error,
            # Microseconds are all a duration means; the other digits would be history bytes.
            duration_ms=round(result.duration_ms, 3),
            resolved_tool_name=result.resolved_tool_name or inp.tool_name,
            display_hint=result.display_hint,
            reflector=self.reflector,
            dispatch=None if result.dispatch is None else result.dispatch.model_dump(mode="json"),
        )

    async def _written(self, ran: Ran, inp: ExecuteAttempt) -> Ran:
        """What the attempt writes after the body: large values go to the database.

        Retried until it lands (``until_written``): the body returned, so failing the
        activity would run it again.
        """
        claimed = await until_written(
            lambda: self._claim_check(ran.output, inp.large_output_bytes),
            what=f"storing the large output of {inp.tool_call_id!r}",
        )
        dispatch = await until_written(
            lambda: self._dispatch_record(ran.dispatch, inp),
            what=f"storing the dispatch record of {inp.tool_call_id!r}",
        )
        return ran.model_copy(update={**claimed, "dispatch": dispatch})
