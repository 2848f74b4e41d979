"""Recorded turns for the replay corpus: one history per pipeline path and workflow type.

``python -m tests.support.history_scenarios [NAME ...]`` (or ``make histories``) runs the
scenarios (all, or the named ones) on a fresh embedded Temporal server and writes each
history to ``tests/histories/<name>.json``. Record only new paths (by name): the files
already there are the proof that a workflow change still replays the turns recorded before
it, or that it needs ``workflow.patched`` (see docs/operations/upgrading.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from sqlalchemy import text

from tests.support.stand_ins import BrokenScratch, PonderingReflector, SlowModel
from tooltrail import (
    AlwaysRecoverable,
    Analysis,
    ApprovalRejected,
    CircuitBreaker,
    FixedDelay,
    Host,
    InputFix,
    LoopDetection,
    NoRetry,
    ReflectionContext,
    RetryForever,
    RunConfig,
    ToolCall,
    ToolChange,
    ToolError,
    ToolOutput,
    Tooltrail,
    TooltrailError,
    TurnCancelled,
    tool,
)
from tooltrail.core.hooks import Ask, Block, PreToolUseContext
from tooltrail.core.memoize import MemoizingMiddleware
from tooltrail.core.results import TextPart
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response
from tooltrail.ops.approver_keys import generate_approver_key, public_key_text
from tooltrail.pipeline.middleware import OutputLimitMiddleware
from tooltrail.runtime.embedded import start_dev_server
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
_state: dict[str, int] = {}


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


@tool
def fails(reason: str = "boom") -> str:
    """Raise a ToolError."""
    raise ToolError(reason)


@tool
def panics() -> str:
    """Raise something unexpected."""
    raise RuntimeError("unexpected")


@tool
def multipart() -> ToolOutput:
    """Return two parts."""
    return ToolOutput(parts=[TextPart("a"), TextPart("b")], display_hint="list")


@tool
def flaky_twice() -> str:
    """Fail twice, then succeed."""
    _state["flaky"] = _state.get("flaky", 0) + 1
    if _state["flaky"] <= 2:
        raise ToolError(f"attempt {_state['flaky']} failed")
    return "recovered"


@tool
async def slow() -> str:
    """Sleep long enough to be cancelled."""
    await asyncio.sleep(60)
    return "late"


class FixThenSwitch:
    """Answers InputFix on the first failure, ToolChange on the next."""

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        if ctx.attempt == 0:
            return Analysis(
                is_recoverable=True, root_cause=ctx.error, correction=InputFix({"reason": "fixed"})
            )
        return Analysis(is_recoverable=True, root_cause=ctx.error, correction=ToolChange("echo"))


@tool(concurrent_safe=True, resource_key=lambda args: args.get("key"))
async def nap(ms: int, key: str | None = None) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(ms / 1000)
    return f"slept {ms}"


@tool(local=True, concurrent_safe=True)
def shout(text: str) -> str:
    """Upper-case the text (a local activity)."""
    return text.upper()


TOOLS = [echo, fails, panics, multipart, flaky_twice, slow, nap, shout]
Scenario = Callable[[Tooltrail], Awaitable[str]]


async def basic(tt: Tooltrail) -> str:
    turn = await tt.run_turn(
        [
            ToolCall("c1", "echo", {"text": "hi"}),
            ToolCall("c2", "ghost", {}),
            ToolCall("c3", "echo", '{"text": '),
            ToolCall("c4", "fails", {}),
            ToolCall("c5", "panics", {}),
            ToolCall("c6", "multipart", "{}"),
            ToolCall("c7", "not_registered", {}),
        ],
        session_id="hist",
        advertised=[*tt.host.registry.names(), "not_registered"],
    )
    return turn.turn_id


async def non_finite_arguments(tt: Tooltrail) -> str:
    # tooltrail-finite-arguments: the model's NaN and Infinity are refused before dispatch.
    turn = await tt.run_turn(
        [
            ToolCall("c1", "echo", '{"text": "a", "x": NaN}'),
            ToolCall("c2", "echo", {"text": "b", "n": float("inf")}),
            ToolCall("c3", "echo", {"text": "ok"}),
        ],
        session_id="hist",
    )
    return turn.turn_id


async def deep_arguments(tt: Tooltrail) -> str:
    # tooltrail-deep-arguments: text nested past Python's parser, and a mapping past
    # json.dumps (the client sends it as text, cut), are refused as nested too deep.
    deep: dict[str, object] = {"text": "bottom"}
    for _ in range(2_000):
        deep = {"inner": deep}
    turn = await tt.run_turn(
        [
            ToolCall("c1", "echo", '{"text": "a", "x": ' + "[" * 2_000 + "]" * 2_000 + "}"),
            ToolCall("c2", "echo", deep),
            ToolCall("c3", "echo", {"text": "ok"}),
        ],
        session_id="hist",
    )
    too_deep = "invalid arguments: nested deeper than 64 levels"
    assert [r.output for r in turn.results] == [too_deep, too_deep, "ok"], turn.results
    return turn.turn_id


async def recovery_backoff(tt: Tooltrail) -> str:
    _state.clear()
    turn = await tt.run_turn([ToolCall("c1", "flaky_twice", {})], session_id="hist")
    return turn.turn_id


async def recovery_exhausted(tt: Tooltrail) -> str:
    handle = await tt.start_turn(
        [ToolCall("c1", "fails", {})], session_id="hist", config=RunConfig(recovery=RetryForever())
    )
    with contextlib.suppress(TooltrailError):
        await handle.result()
    return handle.turn_id


async def corrections(tt: Tooltrail) -> str:
    turn = await tt.run_turn(
        [ToolCall("c1", "fails", {"reason": "x"})],
        session_id="hist",
        config=RunConfig(recovery=FixedDelay(3, 10)),
    )
    return turn.turn_id


class ChangeToHidden:
    """Answers a ToolChange to a tool the model was never offered (a refused correction)."""

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        return Analysis(is_recoverable=True, root_cause=ctx.error, correction=ToolChange("echo"))


async def corrections_checked(tt: Tooltrail) -> str:
    turn = await tt.run_turn(
        [ToolCall("c1", "fails", {"reason": "x"})],
        session_id="hist",
        advertised=["fails"],
        config=RunConfig(recovery=FixedDelay(1, 10)),
    )
    return turn.turn_id


@tool
def page(n: int) -> str:
    """Return 90,000 characters."""
    return str(n) * 90_000


async def memo_budget(tt: Tooltrail) -> str:
    # Memoized outputs past MEMO_CACHE_BYTES: the oldest entries leave the cache (patched).
    turn = await tt.run_turn(
        [ToolCall(f"m{n}", "page", {"n": n}) for n in range(3)],
        session_id="hist-memo-budget",
    )
    return turn.turn_id


async def inline_budget(tt: Tooltrail) -> str:
    # Outputs past RunConfig.inline_output_bytes go to the database (patched).
    turn = await tt.run_turn(
        [ToolCall(f"i{n}", "echo", {"text": str(n) * 600}) for n in range(3)],
        session_id="hist-inline-budget",
        config=RunConfig(inline_output_bytes=1000),
    )
    return turn.turn_id


async def bounded_answers(tt: Tooltrail) -> str:
    # Answers the workflow makes quote names up to QUOTE_CHARS and spend the inline budget
    # (patched): huge never-advertised names, a duplicate id, then a tool past the budget.
    turn = await tt.run_turn(
        [
            ToolCall("b1", "n" * 5000, {}),
            ToolCall("b1", "echo", {"text": "dup"}),
            ToolCall("b2", "g" * 5000, {}),
            ToolCall("b3", "echo", '{"text": '),
            ToolCall("b4", "echo", {"text": "x" * 600}),
        ],
        session_id="hist-bounded-answers",
        config=RunConfig(inline_output_bytes=600),
    )
    return turn.turn_id


async def cancelled_during_tool(tt: Tooltrail) -> str:
    handle = await tt.start_turn(
        [ToolCall("c1", "echo", {"text": "first"}), ToolCall("c2", "slow", {})],
        session_id="hist",
        config=RunConfig(heartbeat_timeout_s=1),
    )
    await asyncio.sleep(1.5)
    await handle.cancel()
    with contextlib.suppress(TurnCancelled):
        await handle.result()
    return handle.turn_id


async def parallel_waves(tt: Tooltrail) -> str:
    turn = await tt.run_turn(
        [
            ToolCall("c1", "nap", {"ms": 50, "key": "a"}),
            ToolCall("c2", "echo", {"text": "unsafe"}),
            ToolCall("c3", "nap", {"ms": 10, "key": "a"}),
            ToolCall("c4", "nap", {"ms": 0}),
            ToolCall("c5", "ghost", {}),
            ToolCall("c6", "nap", {"ms": 20}),
        ],
        session_id="hist",
        config=RunConfig(dispatch="parallel", max_concurrency=2),
    )
    return turn.turn_id


async def parallel_hard_error(tt: Tooltrail) -> str:
    handle = await tt.start_turn(
        [
            ToolCall("c1", "nap", {"ms": 30_000}),
            ToolCall("c2", "nap", {"ms": 0}),
            ToolCall("c3", "fails", {}),
        ],
        session_id="hist",
        config=RunConfig(dispatch="parallel", recovery=RetryForever(), heartbeat_timeout_s=1),
    )
    with contextlib.suppress(TooltrailError):
        await handle.result()
    return handle.turn_id


async def loop_stop(tt: Tooltrail) -> str:
    handle = await tt.start_turn(
        [ToolCall(f"c{i}", "echo", {"text": "again"}) for i in range(11)], session_id="hist-loop"
    )
    with contextlib.suppress(TooltrailError):
        await handle.result()
    return handle.turn_id


class Gatekeeper:
    """Blocks 'fails', asks about 'multipart', allows the rest."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Block | Ask | None:
        if ctx.tool_name == "fails":
            return Block("not this one")
        if ctx.tool_name == "multipart":
            return Ask("really?")
        return None


async def hooks_and_approval(tt: Tooltrail) -> str:
    handle = await tt.start_turn(
        [
            ToolCall("c1", "fails", {}),
            ToolCall("c2", "multipart", {}),
            ToolCall("c3", "echo", {"text": "ok"}),
        ],
        session_id="hist",
        config=RunConfig(interactive=True),
    )
    for _ in range(200):
        if await handle.pending_approvals():
            break
        await asyncio.sleep(0.05)
    await handle.approve("c2", by="recorder")
    await handle.result()
    return handle.turn_id


RECORDER_KEY = generate_approver_key()


async def signed_approval(tt: Tooltrail) -> str:
    handle = await tt.start_turn(
        [ToolCall("c1", "multipart", {}), ToolCall("c2", "echo", {"text": "ok"})],
        session_id="hist-signed",
        config=RunConfig(interactive=True),
    )
    for _ in range(200):
        if await handle.pending_approvals():
            break
        await asyncio.sleep(0.05)
    with contextlib.suppress(ApprovalRejected):  # refused by the validator: no history
        await handle.approve("c1", by="recorder")
    await handle.approve("c1", by="recorder", key=RECORDER_KEY)
    await handle.result()
    return handle.turn_id


class AskBriefly:
    async def pre_tool(self, ctx: PreToolUseContext) -> Ask | None:
        return Ask("quick?", expires_in=0.3) if ctx.tool_name == "multipart" else None


async def ask_expired(tt: Tooltrail) -> str:
    turn = await tt.run_turn(
        [ToolCall("c1", "multipart", {}), ToolCall("c2", "echo", {"text": "ok"})],
        session_id="hist-expired",
        config=RunConfig(interactive=True),
    )
    return turn.turn_id


class AskFirst:
    """Asks about call 'c1', allows the rest."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Ask | None:
        return Ask("go on?") if ctx.tool_call_id == "c1" else None


async def approval_rechecks_loop(tt: Tooltrail) -> str:
    # c1 parks on its Ask while its wave's siblings build a stop-level pattern; approved, it
    # reads the pre-check again and the turn stops (patch "approval-rechecks-loop").
    handle = await tt.start_turn(
        [
            ToolCall("c1", "nap", {"ms": 1}),
            *(ToolCall(f"c{i}", "nap", {"ms": 0}) for i in (2, 3, 4)),
        ],
        session_id="hist-recheck",
        config=RunConfig(
            dispatch="parallel",
            interactive=True,
            detection=LoopDetection(loop_threshold=2, stop_threshold=3),
        ),
    )
    for _ in range(200):
        if await handle.pending_approvals():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the siblings' results reach the workflow
    await handle.approve("c1", by="recorder")
    with contextlib.suppress(TooltrailError):
        await handle.result()
    return handle.turn_id


async def authorize_tool(tt: Tooltrail) -> str:
    # The preflight runs on a worker: one short workflow, whose id the client picks.
    await tt.authorize_tool("echo", {"text": "x"})
    workflow_id = ""
    async for execution in tt.client.list_workflows("WorkflowType = 'AuthorizeToolWorkflow'"):
        workflow_id = execution.id
    return workflow_id


async def memo_in_place(tt: Tooltrail) -> str:
    # Memoize registered second: the hit is served in the activity, at its place.
    turn = await tt.run_turn(
        [ToolCall("c1", "echo", {"text": "twice"}), ToolCall("c2", "echo", {"text": "twice"})],
        session_id="hist-memo-in-place",
    )
    return turn.turn_id


async def breaker_and_memo(tt: Tooltrail) -> str:
    await tt.run_turn([ToolCall("c0", "echo", {"text": "cache me"})], session_id="hist-memo")
    turn = await tt.run_turn(
        [
            ToolCall("c1", "echo", {"text": "cache me"}),
            ToolCall("c2", "fails", {}),
            ToolCall("c3", "fails", {}),
        ],
        session_id="hist-memo",
    )
    return turn.turn_id


async def shadow_replay(tt: Tooltrail) -> str:
    original = await tt.run_turn(
        [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "fails", {})], session_id="hist"
    )
    report = await tt.rerun(original.turn_id, shadow=True)
    return report.new_turn_id


async def batched_audit(tt: Tooltrail) -> str:
    # Audit batches before every call (audit_interval_s=0) and before each backoff timer, a
    # local tool, and a parallel wave.
    _state.clear()
    turn = await tt.run_turn(
        [
            ToolCall("c1", "shout", {"text": "a"}),
            ToolCall("c2", "echo", {"text": "b"}),
            ToolCall("c3", "flaky_twice", {}),
            ToolCall("c4", "shout", {"text": "d"}),
            ToolCall("c5", "nap", {"ms": 10}),
        ],
        session_id="hist-batched",
        config=RunConfig(
            audit_interval_s=0, recovery=FixedDelay(3, 10), dispatch="parallel", max_concurrency=2
        ),
    )
    return turn.turn_id


async def model_turn(tt: Tooltrail) -> str:
    # One model turn of an agent run (a child TurnWorkflow with the model phase and tools).
    result = await tt.run_agent("go", session_id="hist-agent-turn", turns_per_segment=2)
    return result.turns[1]


async def model_turn_too_many_calls(tt: Tooltrail) -> str:
    # A model turn with more calls than RunConfig.max_calls: none runs (a patched path).
    result = await tt.run_agent(
        "go", session_id="hist-too-many", config=RunConfig(max_calls=2), turns_per_segment=1
    )
    return result.turns[0]


async def parallel_model_turn(tt: Tooltrail) -> str:
    # A model turn whose calls the worker judged safe: they run in waves.
    result = await tt.run_agent(
        "go", session_id="hist-agent-par", config=RunConfig(dispatch="parallel")
    )
    return result.turns[0]


@tool(local=True, idempotent=True)
def charge_local(order: str) -> str:
    """Charge an order once (a local tool)."""
    return f"charged {order}"


async def local_attempt_spent(tt: Tooltrail) -> str:
    # A local attempt out of infrastructure retries (its idempotency key cannot be claimed
    # while the table is away): a soft failed attempt, not a failed turn.
    async with tt.store.engine.begin() as connection:
        await connection.execute(text("ALTER TABLE idempotency_record RENAME TO away"))
    try:
        turn = await tt.run_turn(
            [ToolCall("c1", "charge_local", {"order": "o-1"})],
            session_id="hist-local-spent",
            config=RunConfig(infrastructure_retries=2, recovery=NoRetry()),
        )
    finally:
        async with tt.store.engine.begin() as connection:
            await connection.execute(text("ALTER TABLE away RENAME TO idempotency_record"))
    assert turn.results[0].is_error, turn.results
    return turn.turn_id


@tool
async def hangs() -> str:
    """Never return in time (a regular tool without timeout_s)."""
    await asyncio.sleep(3600)
    return "late"


@tool(local=True)
async def hangs_local() -> str:
    """Never return in time (a local tool without timeout_s)."""
    await asyncio.sleep(3600)
    return "late"


async def attempt_timed_out(tt: Tooltrail) -> str:
    # tooltrail-attempt-timeouts: an attempt out of tool_timeout_s is started once and
    # answered "timed out", a regular one and a local one.
    turn = await tt.run_turn(
        [ToolCall("c1", "hangs", {}), ToolCall("c2", "hangs_local", {})],
        session_id="hist-timed-out",
        config=RunConfig(tool_timeout_s=1, recovery=NoRetry()),
    )
    assert [r.output for r in turn.results] == [
        "Tool 'hangs' timed out after 1s",
        "Tool 'hangs_local' timed out after 1s",
    ], turn.results
    return turn.turn_id


async def local_attempt_timed_out(tt: Tooltrail) -> str:
    # A local attempt out of time. Its file was recorded by tooltrail before
    # tooltrail-attempt-timeouts (the SDK retried the timeout; the turn read Temporal's
    # words): on replay the SDK raises that timeout bare, which once escaped the turn.
    # Recording it again records today's shape (as attempt_timed_out has it).
    turn = await tt.run_turn(
        [ToolCall("c1", "hangs_local", {})],
        session_id="hist-local-timed-out",
        config=RunConfig(tool_timeout_s=1, infrastructure_retries=2, recovery=NoRetry()),
    )
    assert turn.results[0].is_error, turn.results
    return turn.turn_id


async def model_call_cancelled(tt: Tooltrail) -> str:
    # The run is cancelled while its turn waits for the model: the turn ends cancelled.
    handle = await tt.start_agent("wait", session_id="hist-model-cancel")
    await asyncio.sleep(1.5)
    await handle.cancel()
    with contextlib.suppress(TurnCancelled):
        await handle.result()
    return f"{handle.run_id}-turn-0"


async def reflector_cancelled(tt: Tooltrail) -> str:
    # The turn is cancelled while the reflector judges a failure: it ends cancelled.
    handle = await tt.start_turn([ToolCall("c1", "fails", {})], session_id="hist")
    await asyncio.sleep(1.5)
    await handle.cancel()
    with contextlib.suppress(TurnCancelled):
        await handle.result()
    return handle.turn_id


@tool
def peer_only(key: str) -> str:
    """A tool only the peer worker of ``tool_routed`` has."""
    return f"peer:{key}"


async def tool_routed(tt: Tooltrail) -> str:
    # A peer worker with another tool polls the same queue: a call of its tool that lands on
    # the recorder's worker is refused there and sent to the peer's tools queue, and the
    # turn's next call of that tool goes there directly.
    from temporalio.client import Client

    from tooltrail.pipeline.directory import RegistryDirectory

    peer_client = await Client.connect(
        tt.client.service_client.config.target_host, data_converter=tt.client.data_converter
    )
    peer_host = Host([peer_only])
    async with build_worker(peer_client, peer_host, task_queue=tt.task_queue, store=tt.store):
        probe = RegistryDirectory(tt.client, tt.store, tt.task_queue, {}, ttl_s=0.0)
        for _ in range(200):
            if await probe.peer_queue_for("peer_only") and await probe.peer_queue_for("echo"):
                break
            await asyncio.sleep(0.05)
        for n in range(50):
            result = await tt.run_turn(
                [
                    ToolCall("r1", "echo", {"text": "here"}),
                    ToolCall("r2", "peer_only", {"key": "a"}),
                    ToolCall("r3", "peer_only", {"key": "b"}),
                ],
                session_id=f"hist-routed-{n}",
            )
            assert [r.output for r in result.results] == ["here", "peer:a", "peer:b"]
            events = await tt.audit(result.turn_id)
            if [e.tool_name for e in events if e.kind == "tool_routed"] == ["peer_only"]:
                return result.turn_id
    raise AssertionError("no turn of 50 had its peer's tool routed")


@contextlib.contextmanager
def broken_scratch() -> Iterator[None]:
    """Make every worker's scratch cleanup fail (the recorder builds the workers itself)."""
    original = ScratchDirs.remove
    ScratchDirs.remove = BrokenScratch.remove  # type: ignore[method-assign]
    try:
        yield
    finally:
        ScratchDirs.remove = original  # type: ignore[method-assign]


async def cleanup_fails(tt: Tooltrail) -> str:
    # The run's scratch cleanup fails every try: the run still ends with its answer.
    with broken_scratch():
        result = await tt.run_agent("go", session_id="hist-cleanup-fails")
    return result.run_id


async def close_session_fails(tt: Tooltrail) -> str:
    # Closing a session whose scratch cleanup fails every try answers False.
    workflow_id = f"close-session-failing-{uuid.uuid4()}"
    from tooltrail.core.wire import CloseSessionInput

    with broken_scratch():
        removed = await tt.client.execute_workflow(
            "CloseSessionWorkflow",
            CloseSessionInput(session_id="failing"),
            id=workflow_id,
            task_queue=tt.task_queue,
            result_type=bool,
        )
    assert removed is False
    return workflow_id


async def local_model_turn(tt: Tooltrail) -> str:
    # A model turn whose model call is a local activity (start_agent(local_model=True)).
    result = await tt.run_agent("go", session_id="hist-agent-local", local_model=True)
    return result.turns[1]


def agent_model() -> ScriptedModel:
    """Three model turns with tools, then the answer."""
    return ScriptedModel(
        [
            tool_call_response(("a1", "echo", {"text": "one"})),
            tool_call_response(("a2", "echo", {"text": "two"}), ("a3", "ghost", "{}")),
            tool_call_response(("a4", "echo", '{"text": ')),
            text_response("all done"),
        ]
    )


async def agent_run(tt: Tooltrail) -> str:
    result = await tt.run_agent("go", session_id="hist-agent", turns_per_segment=2)
    return result.run_id


async def tool_catalog(tt: Tooltrail) -> str:
    # A client asks a worker which tools it serves (what Tooltrail.worker_tools runs).
    workflow_id = f"tool-catalog-{uuid.uuid4()}"
    from tooltrail.core.wire import WorkerCatalog

    catalog = await tt.client.execute_workflow(
        "ToolCatalogWorkflow", id=workflow_id, task_queue=tt.task_queue, result_type=WorkerCatalog
    )
    assert "echo" in catalog.names, catalog
    return workflow_id


async def close_session(tt: Tooltrail) -> str:
    await tt.run_turn([ToolCall("c1", "echo", {"text": "x"})], session_id="closing")
    workflow_id = f"close-session-closing-{uuid.uuid4()}"
    from tooltrail.core.wire import CloseSessionInput

    await tt.client.execute_workflow(
        "CloseSessionWorkflow",
        CloseSessionInput(session_id="closing"),
        id=workflow_id,
        task_queue=tt.task_queue,
        result_type=bool,
    )
    return workflow_id


SCENARIOS: dict[str, tuple[Scenario, Host]] = {
    "basic": (basic, Host(TOOLS)),
    "non_finite_arguments": (non_finite_arguments, Host(TOOLS)),
    "deep_arguments": (deep_arguments, Host(TOOLS)),
    "recovery_backoff": (recovery_backoff, Host(TOOLS, reflector=AlwaysRecoverable())),
    "recovery_exhausted": (recovery_exhausted, Host(TOOLS, reflector=AlwaysRecoverable())),
    "corrections": (corrections, Host(TOOLS, reflector=FixThenSwitch())),
    "corrections_checked": (corrections_checked, Host(TOOLS, reflector=ChangeToHidden())),
    "cancelled_during_tool": (cancelled_during_tool, Host(TOOLS)),
    # The same turns past the trail's memo anchor (tooltrail-trail-anchor-memo).
    "recovery_exhausted_anchored": (recovery_exhausted, Host(TOOLS, reflector=AlwaysRecoverable())),
    "cancelled_during_tool_anchored": (cancelled_during_tool, Host(TOOLS)),
    "close_session": (close_session, Host(TOOLS)),
    "parallel_waves": (parallel_waves, Host(TOOLS)),
    "parallel_hard_error": (parallel_hard_error, Host(TOOLS, reflector=AlwaysRecoverable())),
    "loop_stop": (loop_stop, Host(TOOLS)),
    "hooks_and_approval": (hooks_and_approval, Host(TOOLS, hooks=[Gatekeeper()])),
    "approval_rechecks_loop": (approval_rechecks_loop, Host(TOOLS, hooks=[AskFirst()])),
    "authorize_tool": (authorize_tool, Host(TOOLS)),
    "memo_in_place": (
        memo_in_place,
        Host(TOOLS, middleware=[OutputLimitMiddleware(1000), MemoizingMiddleware(["echo"])]),
    ),
    "shadow_replay": (shadow_replay, Host(TOOLS)),
    "ask_expired": (ask_expired, Host(TOOLS, hooks=[AskBriefly()])),
    "signed_approval": (
        signed_approval,
        Host(
            TOOLS,
            hooks=[Gatekeeper()],
            approvers={"recorder": public_key_text(RECORDER_KEY)},
        ),
    ),
    # The same approvals taken up and proven by the worker (tooltrail-approval-proof).
    "approval_proof": (hooks_and_approval, Host(TOOLS, hooks=[Gatekeeper()])),
    "signed_approval_proof": (
        signed_approval,
        Host(
            TOOLS,
            hooks=[Gatekeeper()],
            approvers={"recorder": public_key_text(RECORDER_KEY)},
        ),
    ),
    "batched_audit": (batched_audit, Host(TOOLS, reflector=AlwaysRecoverable())),
    "model_turn": (model_turn, Host(TOOLS, model=agent_model())),
    "model_turn_local_model": (local_model_turn, Host(TOOLS, model=agent_model())),
    "local_attempt_spent": (local_attempt_spent, Host([*TOOLS, charge_local])),
    "attempt_timed_out": (attempt_timed_out, Host([*TOOLS, hangs, hangs_local])),
    "local_attempt_timed_out": (local_attempt_timed_out, Host([*TOOLS, hangs_local])),
    "model_call_cancelled": (model_call_cancelled, Host(TOOLS, model=SlowModel())),
    "reflector_cancelled": (reflector_cancelled, Host(TOOLS, reflector=PonderingReflector())),
    "close_session_fails": (close_session_fails, Host(TOOLS)),
    "tool_catalog": (tool_catalog, Host(TOOLS)),
    "tool_routed": (tool_routed, Host(TOOLS)),
    "agent_cleanup_fails": (cleanup_fails, Host(TOOLS, model=ScriptedModel([text_response("ok")]))),
    "model_turn_parallel": (
        parallel_model_turn,
        Host(
            TOOLS,
            model=ScriptedModel(
                [
                    tool_call_response(
                        ("p1", "nap", {"ms": 30, "key": "a"}),
                        ("p2", "nap", {"ms": 10, "key": "a"}),
                        ("p3", "nap", {"ms": 0}),
                        ("p4", "echo", {"text": "alone"}),
                    ),
                    text_response("napped"),
                ]
            ),
        ),
    ),
    "model_turn_too_many_calls": (
        model_turn_too_many_calls,
        Host(
            TOOLS,
            model=ScriptedModel(
                [
                    tool_call_response(
                        ("m1", "echo", {"text": "a"}),
                        ("m2", "echo", {"text": "b"}),
                        ("m3", "echo", {"text": "c"}),
                    ),
                    text_response("too many"),
                ]
            ),
        ),
    ),
    "agent_run": (
        agent_run,
        Host(
            TOOLS,
            model=agent_model(),
        ),
    ),
    "inline_budget": (inline_budget, Host(TOOLS)),
    "bounded_answers": (bounded_answers, Host(TOOLS)),
    "memo_budget": (
        memo_budget,
        Host([*TOOLS, page], middleware=[MemoizingMiddleware(["page"])]),
    ),
    "breaker_and_memo": (
        breaker_and_memo,
        Host(
            TOOLS,
            circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=60),
            middleware=[MemoizingMiddleware(["echo"])],
        ),
    ),
}


async def record(only: set[str]) -> None:
    """Run the scenarios (all, or those named) and write their histories."""
    HISTORIES.mkdir(exist_ok=True)
    env = await start_dev_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/audit.db"
            await upgrade(url)
            for name, (scenario, host) in SCENARIOS.items():
                if only and name not in only:
                    continue
                store = AuditStore(url)
                task_queue = f"record-{name}"
                tt = Tooltrail(env.client, host, task_queue=task_queue, store=store)
                async with build_worker(env.client, host, task_queue=task_queue, store=store):
                    workflow_id = await scenario(tt)
                history = await env.client.get_workflow_handle(workflow_id).fetch_history()
                # Temporal's JSON format has no workflow id, but replay needs the real one (an
                # agent run derives its turns' ids from it): keep it next to the events.
                data = {"workflowId": workflow_id, **json.loads(history.to_json())}
                (HISTORIES / f"{name}.json").write_text(json.dumps(data) + "\n")
                await store.close()
                print(f"recorded {name}: {len(history.events)} events")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    import sys

    asyncio.run(record(set(sys.argv[1:])))
