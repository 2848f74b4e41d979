"""Unit tests of the middleware pipeline and the similarity helpers (spec §3.3, §12, §13).

Pure asyncio: layers run around a fake core or a real ``ToolCallMiddleware`` over a
``ToolRegistry``; no Temporal, no database.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tooltrail.core.results import ImagePart, Part, TextPart, ToolOutput
from tooltrail.core.similarity import best_match, common_prefix_length, lcs_length, similarity
from tooltrail.errors import ToolError
from tooltrail.pipeline.middleware import (
    TRUNCATION_MARKER,
    Middleware,
    MiddlewareCall,
    MiddlewareResult,
    Next,
    OutputLimitMiddleware,
    PermissionAllow,
    PermissionAsk,
    PermissionDecision,
    PermissionDeny,
    PermissionMiddleware,
    PermissionModify,
    RedactingMiddleware,
    TimeoutMiddleware,
    ToolCallMiddleware,
    UnknownToolMiddleware,
    VerifyMiddleware,
    compose,
    run_pipeline,
)
from tooltrail.tools import ToolContext, ToolRegistry, tool

# -- helpers ---------------------------------------------------------------------------------


def make_ctx(call_id: str = "call_1") -> ToolContext:
    return ToolContext(
        session_id="s1", turn_id="t1", tool_call_id=call_id, attempt=0, temp_dir=Path("/tmp")
    )


def make_call(
    name: str = "echo",
    arguments: dict[str, Any] | None = None,
    *,
    call_id: str = "call_1",
    registry_names: tuple[str, ...] = ("echo",),
) -> MiddlewareCall:
    return MiddlewareCall(
        tool_name=name,
        arguments={} if arguments is None else arguments,
        tool_call_id=call_id,
        ctx=make_ctx(call_id),
        registry_names=registry_names,
    )


class FakeCore:
    """A core that records what reached it and answers with a fixed result."""

    def __init__(
        self,
        output: str | list[Part] = "ok",
        *,
        is_error: bool = False,
        duration_ms: float = 5.0,
        tool_call_id: str = "",
    ) -> None:
        self.output = output
        self.is_error = is_error
        self.duration_ms = duration_ms
        self.tool_call_id = tool_call_id
        self.calls: list[MiddlewareCall] = []

    async def __call__(self, call: MiddlewareCall) -> MiddlewareResult:
        self.calls.append(call)
        return MiddlewareResult(
            output=self.output,
            is_error=self.is_error,
            duration_ms=self.duration_ms,
            resolved_tool_name=call.tool_name,
            tool_call_id=self.tool_call_id,
        )


def tracer(label: str, trace: list[str]) -> Middleware:
    async def layer(call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        trace.append(f"{label}:before")
        result = await call_next(call)
        trace.append(f"{label}:after")
        return result

    return layer


def renamer(new_name: str) -> Middleware:
    async def layer(call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        return await call_next(replace(call, tool_name=new_name))

    return layer


def id_rewriter(garbage: str) -> Middleware:
    async def layer(call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        result = await call_next(replace(call, tool_call_id=garbage))
        return replace(result, tool_call_id=garbage)

    return layer


# -- similarity (spec §3.3) ------------------------------------------------------------------


def test_lcs_length() -> None:
    assert lcs_length("basj", "bash") == 3
    assert lcs_length("abcde", "ace") == 3
    assert lcs_length("ace", "abcde") == 3
    assert lcs_length("", "abc") == 0
    assert lcs_length("abc", "") == 0
    assert lcs_length("xyz", "bash") == 0
    assert lcs_length("Bash", "bash") == 3  # exact characters: callers lowercase first


def test_common_prefix_length() -> None:
    assert common_prefix_length("basj", "bash") == 3
    assert common_prefix_length("read", "write") == 0
    assert common_prefix_length("", "x") == 0
    assert common_prefix_length("same", "same") == 4
    assert common_prefix_length("ab", "abc") == 2


def test_similarity_reference_examples() -> None:
    assert similarity("basj", "bash") == 0.825
    assert similarity("xyz", "bash") == 0.0


def test_similarity_edge_cases() -> None:
    assert similarity("", "") == 1.0
    assert similarity("", "bash") == 0.0
    assert similarity("bash", "") == 0.0
    assert similarity("BASH", "bash") == 1.0
    assert similarity("Basj", "bash") == 0.825
    # No shared prefix: the plain LCS ratio.
    assert similarity("ash", "bash") == 3 / 4
    # Scores can exceed 1.0.
    assert similarity("a" * 19 + "b", "a" * 19 + "c") > 1.0


def test_best_match_highest_score_wins() -> None:
    assert best_match("basj", ["zsh", "bash", "fish"], 0.4) == "bash"
    assert best_match("xyz", ["bash"], 0.4) is None
    assert best_match("anything", [], 0.0) is None


def test_best_match_ties_keep_first_sorted_name() -> None:
    # "ab" scores the same against "ac" and "ad"; candidate order must not matter.
    assert similarity("ab", "ac") == similarity("ab", "ad")
    assert best_match("ab", ["ad", "ac"], 0.1) == "ac"
    assert best_match("ab", ["ac", "ad"], 0.1) == "ac"


def test_best_match_threshold_is_inclusive_and_zero_never_matches() -> None:
    assert best_match("basj", ["bash"], 0.825) == "bash"
    assert best_match("basj", ["bash"], 0.826) is None
    assert best_match("xyz", ["bash"], 0.0) is None


# -- compose, ordering, renaming, ids ----------------------------------------------------------


async def test_first_registered_is_outermost() -> None:
    trace: list[str] = []
    core = FakeCore()

    async def traced_core(call: MiddlewareCall) -> MiddlewareResult:
        trace.append("core")
        return await core(call)

    handler = compose([tracer("a", trace), tracer("b", trace), tracer("c", trace)], traced_core)
    result = await handler(make_call())
    assert result.output == "ok"
    assert trace == [
        "a:before",
        "b:before",
        "c:before",
        "core",
        "c:after",
        "b:after",
        "a:after",
    ]


async def test_no_layers_is_the_core() -> None:
    core = FakeCore("plain")
    result = await compose([], core)(make_call())
    assert result.output == "plain"
    assert len(core.calls) == 1


async def test_a_layer_can_short_circuit() -> None:
    core = FakeCore()

    async def refuse(call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        return MiddlewareResult("refused", True, 0.0, call.tool_name)

    result = await compose([refuse], core)(make_call())
    assert result.output == "refused"
    assert core.calls == []


async def test_renaming_changes_what_the_core_sees_and_the_resolved_name() -> None:
    core = FakeCore()
    seen_by_inner: list[str] = []

    async def inner(call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        seen_by_inner.append(call.tool_name)
        return await call_next(call)

    result = await run_pipeline([renamer("bash"), inner], core, make_call("sh"))
    assert seen_by_inner == ["bash"]
    assert [call.tool_name for call in core.calls] == ["bash"]
    assert result.resolved_tool_name == "bash"


async def test_renaming_with_the_real_core_runs_the_other_tool() -> None:
    @tool
    async def bash(command: str) -> str:
        return f"ran {command}"

    registry = ToolRegistry([bash])
    call = make_call("sh", {"command": "ls"}, registry_names=tuple(registry.names()))
    result = await run_pipeline([renamer("bash")], ToolCallMiddleware(registry), call)
    assert result.output == "ran ls"
    assert result.is_error is False
    assert result.resolved_tool_name == "bash"


async def test_engine_stamps_the_model_issued_id_scenario_22() -> None:
    async def made_up(call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        return replace(await call_next(call), tool_call_id="made_up")

    result = await run_pipeline([made_up], FakeCore(), make_call(call_id="call_1"))
    assert result.tool_call_id == "call_1"


async def test_ids_survive_stacked_rewriters_across_retries_scenario_21() -> None:
    outcomes = iter([("flaky failure", True), ("ok", False)])
    seen_ids: list[str] = []

    async def flaky(call: MiddlewareCall) -> MiddlewareResult:
        seen_ids.append(call.tool_call_id)
        output, is_error = next(outcomes)
        return MiddlewareResult(output, is_error, 1.0, call.tool_name, tool_call_id="")

    layers = [id_rewriter("garbage-1"), id_rewriter(""), id_rewriter("garbage-3")]
    first = await run_pipeline(layers, flaky, make_call(call_id="call_x"))
    second = await run_pipeline(layers, flaky, make_call(call_id="call_x"))
    assert (first.is_error, first.tool_call_id) == (True, "call_x")
    assert (second.is_error, second.output, second.tool_call_id) == (False, "ok", "call_x")
    assert seen_ids == ["garbage-3", "garbage-3"]  # what the layers fed the core is moot


async def test_run_pipeline_fills_an_empty_resolved_name() -> None:
    async def nameless(call: MiddlewareCall) -> MiddlewareResult:
        return MiddlewareResult("ok", False, 0.0, "")

    result = await run_pipeline([], nameless, make_call("echo"))
    assert result.resolved_tool_name == "echo"


def test_registry_names_are_stored_sorted() -> None:
    call = make_call(registry_names=("tool_2", "b", "tool_10", "a"))
    assert call.registry_names == ("a", "b", "tool_10", "tool_2")


# -- the registry core (spec §2.3, §3.2) -------------------------------------------------------


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool
def sync_echo(text: str) -> str:
    """Echo the text from a thread."""
    return text


@tool
async def fails(ctx: ToolContext) -> str:
    """Fail expectedly."""
    raise ToolError("boom")


@tool
async def p() -> str:
    """Panic."""
    raise RuntimeError("x")


@tool
async def hinted() -> ToolOutput:
    """Return parts and a hint."""
    return ToolOutput(parts=[TextPart("a"), ImagePart("image/png", "AAAA")], display_hint="img")


@tool(timeout_s=0.05)
async def sleepy() -> str:
    """Sleep past the tool's own timeout."""
    await asyncio.sleep(5)
    return "late"


CORE_REGISTRY = ToolRegistry([echo, sync_echo, fails, p, hinted, sleepy])


async def run_core(name: str, arguments: dict[str, Any] | None = None) -> MiddlewareResult:
    core = ToolCallMiddleware(CORE_REGISTRY)
    call = make_call(name, arguments, registry_names=tuple(CORE_REGISTRY.names()))
    return await run_pipeline([], core, call)


async def test_core_success() -> None:
    result = await run_core("echo", {"text": "hi"})
    assert (result.output, result.is_error, result.resolved_tool_name) == ("hi", False, "echo")
    assert result.tool_call_id == "call_1"
    assert result.duration_ms >= 0.0
    assert (await run_core("sync_echo", {"text": "t"})).output == "t"


async def test_core_tool_error_is_verbatim() -> None:
    result = await run_core("fails")
    assert (result.output, result.is_error) == ("boom", True)


async def test_core_panic_text() -> None:
    result = await run_core("p")
    assert (result.output, result.is_error) == ("tool 'p' panicked: x", True)


async def test_core_not_found_text() -> None:
    result = await run_core("nope")
    assert result.is_error is True
    assert result.duration_ms == 0.0
    assert result.resolved_tool_name == "nope"
    assert result.output == (
        "Tool not found: nope. Available: echo, fails, hinted, p, sleepy, sync_echo"
    )


async def test_core_validation_rejection() -> None:
    result = await run_core("echo", {})
    assert result.is_error is True
    assert result.duration_ms == 0.0
    assert isinstance(result.output, str)
    assert result.output.startswith("guardrail violation:")


async def test_core_multipart_and_display_hint() -> None:
    result = await run_core("hinted")
    assert result.output == [TextPart("a"), ImagePart("image/png", "AAAA")]
    assert result.display_hint == "img"


async def test_core_applies_the_tools_own_timeout() -> None:
    result = await run_core("sleepy")
    assert (result.output, result.is_error) == ("Tool 'sleepy' timed out after 0s", True)


# -- TimeoutMiddleware ---------------------------------------------------------------------


def test_timeout_defaults_and_constructors() -> None:
    default = TimeoutMiddleware()
    assert (default.seconds, default.retry_on_timeout, default.max_retries) == (120, False, 0)
    assert TimeoutMiddleware.none().seconds is None
    assert TimeoutMiddleware.from_secs(7).seconds == 7
    with pytest.raises(ValueError, match="seconds"):
        TimeoutMiddleware(-1)
    with pytest.raises(ValueError, match="max_retries"):
        TimeoutMiddleware(1, retry_on_timeout=True, max_retries=-1)


async def test_timeout_scenario_45() -> None:
    @tool
    async def t() -> str:
        await asyncio.sleep(5)
        return "done"

    registry = ToolRegistry([t])
    call = make_call("t", registry_names=tuple(registry.names()))
    started = time.monotonic()
    result = await run_pipeline(
        [TimeoutMiddleware.from_secs(1)], ToolCallMiddleware(registry), call
    )
    assert time.monotonic() - started < 3.0
    assert result.output == "Tool 't' timed out after 1s"
    assert result.is_error is True
    assert result.duration_ms == 1000.0
    assert result.resolved_tool_name == "t"


async def test_timeout_passes_fast_results_through() -> None:
    result = await run_pipeline([TimeoutMiddleware.from_secs(5)], FakeCore("quick"), make_call())
    assert (result.output, result.is_error) == ("quick", False)


async def test_timeout_none_never_times_out() -> None:
    async def slowish(call: MiddlewareCall) -> MiddlewareResult:
        await asyncio.sleep(0.05)
        return MiddlewareResult("slow but fine", False, 50.0, call.tool_name)

    result = await run_pipeline([TimeoutMiddleware.none()], slowish, make_call())
    assert result.output == "slow but fine"


async def test_timeout_cancels_the_inner_call() -> None:
    cancelled = asyncio.Event()

    async def hang(call: MiddlewareCall) -> MiddlewareResult:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not reached")

    result = await run_pipeline([TimeoutMiddleware.from_secs(0.05)], hang, make_call("t"))
    assert result.output == "Tool 't' timed out after 0s"
    assert result.duration_ms == 50.0
    assert cancelled.is_set()


async def test_timeout_tells_a_sync_body_to_stop() -> None:
    stopped = threading.Event()

    @tool
    def spin(ctx: ToolContext) -> str:
        deadline = time.monotonic() + 5
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        if ctx.cancelled:
            stopped.set()
        return "spun"

    registry = ToolRegistry([spin])
    call = make_call("spin", registry_names=("spin",))
    result = await run_pipeline(
        [TimeoutMiddleware.from_secs(0.05)], ToolCallMiddleware(registry), call
    )
    assert result.output == "Tool 'spin' timed out after 0s"
    assert await asyncio.to_thread(stopped.wait, 2.0)


async def test_timeout_deadline_doubles_per_retry() -> None:
    allowed: list[float] = []

    async def hang(call: MiddlewareCall) -> MiddlewareResult:
        started = time.monotonic()
        try:
            await asyncio.sleep(10)
        finally:
            allowed.append(time.monotonic() - started)
        raise AssertionError("not reached")

    layer = TimeoutMiddleware(0.05, retry_on_timeout=True, max_retries=2)
    result = await run_pipeline([layer], hang, make_call("t"))
    assert len(allowed) == 3
    for got, deadline in zip(allowed, [0.05, 0.1, 0.2], strict=True):
        assert deadline * 0.9 <= got < deadline + 0.5
    assert result.output == "Tool 't' timed out after 0s"
    assert result.duration_ms == 200.0  # the last (doubled) deadline


async def test_timeout_text_uses_whole_seconds_of_the_current_deadline() -> None:
    async def hang(call: MiddlewareCall) -> MiddlewareResult:
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    layer = TimeoutMiddleware(0.5, retry_on_timeout=True, max_retries=1)
    result = await run_pipeline([layer], hang, make_call("t"))
    assert result.output == "Tool 't' timed out after 1s"
    assert result.duration_ms == 1000.0


async def test_timeout_retry_can_succeed_with_a_fresh_cancel_flag() -> None:
    runs: list[bool] = []

    @tool
    def once_slow(ctx: ToolContext) -> str:
        first = not runs
        runs.append(ctx.cancelled)
        if first:
            while not ctx.cancelled:
                time.sleep(0.005)
            return "stopped"
        return "cancelled" if ctx.cancelled else "ok"

    registry = ToolRegistry([once_slow])
    layer = TimeoutMiddleware(0.05, retry_on_timeout=True, max_retries=1)
    call = make_call("once_slow", registry_names=("once_slow",))
    result = await run_pipeline([layer], ToolCallMiddleware(registry), call)
    assert (result.output, result.is_error) == ("ok", False)
    assert runs == [False, False]


async def test_timeout_without_retry_flag_runs_once() -> None:
    runs = 0

    async def hang(call: MiddlewareCall) -> MiddlewareResult:
        nonlocal runs
        runs += 1
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    layer = TimeoutMiddleware(0.02, retry_on_timeout=False, max_retries=3)
    result = await run_pipeline([layer], hang, make_call("t"))
    assert runs == 1
    assert result.duration_ms == 20.0


async def test_timeout_does_not_claim_an_inner_timeout_error() -> None:
    async def raises_timeout(call: MiddlewareCall) -> MiddlewareResult:
        raise TimeoutError("not ours")

    with pytest.raises(TimeoutError, match="not ours"):
        await run_pipeline([TimeoutMiddleware.from_secs(5)], raises_timeout, make_call())


async def test_outer_cancellation_propagates_through_timeout() -> None:
    started = asyncio.Event()

    async def hang(call: MiddlewareCall) -> MiddlewareResult:
        started.set()
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    task = asyncio.create_task(run_pipeline([TimeoutMiddleware.from_secs(5)], hang, make_call()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- PermissionMiddleware ------------------------------------------------------------------


async def test_permission_allow_passes_through() -> None:
    core = FakeCore()
    layer = PermissionMiddleware(lambda call: PermissionAllow())
    result = await run_pipeline([layer], core, make_call())
    assert result.output == "ok"
    assert len(core.calls) == 1


async def test_permission_modify_replaces_the_input() -> None:
    core = FakeCore()

    async def policy(call: MiddlewareCall) -> PermissionDecision:
        return PermissionModify({"path": "/safe"})

    await run_pipeline([PermissionMiddleware(policy)], core, make_call("read", {"path": "/etc"}))
    assert core.calls[0].arguments == {"path": "/safe"}


def test_permission_modify_needs_a_mapping() -> None:
    with pytest.raises(TypeError, match="mapping"):
        PermissionModify("nope")  # type: ignore[arg-type]


async def test_permission_deny_text_and_no_execution() -> None:
    core = FakeCore()
    layer = PermissionMiddleware(lambda call: PermissionDeny("not today"))
    result = await run_pipeline([layer], core, make_call("rm"))
    assert result.output == "Permission not today for tool 'rm'"
    assert (result.is_error, result.duration_ms, result.resolved_tool_name) == (True, 0.0, "rm")
    assert core.calls == []


async def test_permission_deny_all() -> None:
    core = FakeCore()
    result = await run_pipeline([PermissionMiddleware.deny_all()], core, make_call("rm"))
    assert result.output == "Permission blocked by policy for tool 'rm'"
    assert result.is_error is True
    assert core.calls == []


async def test_permission_ask_without_resolver_is_denied() -> None:
    core = FakeCore()
    layer = PermissionMiddleware(lambda call: PermissionAsk("delete everything?"))
    result = await run_pipeline([layer], core, make_call("rm"))
    assert result.output == "Permission permission required: delete everything? for tool 'rm'"
    assert (result.is_error, result.duration_ms) == (True, 0.0)
    assert core.calls == []


async def test_permission_ask_with_resolver() -> None:
    prompts: list[tuple[str, str]] = []

    async def approve(prompt: str, call: MiddlewareCall) -> bool:
        prompts.append((prompt, call.tool_name))
        return True

    core = FakeCore()
    layer = PermissionMiddleware(lambda call: PermissionAsk("sure?"), resolver=approve)
    result = await run_pipeline([layer], core, make_call("rm"))
    assert result.output == "ok"
    assert prompts == [("sure?", "rm")]

    refused = PermissionMiddleware(lambda call: PermissionAsk("sure?"), resolver=lambda p, c: False)
    core = FakeCore()
    result = await run_pipeline([refused], core, make_call("rm"))
    assert result.output == "Permission denied by user for tool 'rm'"
    assert (result.is_error, result.duration_ms) == (True, 0.0)
    assert core.calls == []


async def test_permission_resolver_cancelled_while_waiting() -> None:
    async def dismissed(prompt: str, call: MiddlewareCall) -> bool:
        raise asyncio.CancelledError  # the approval UI went away; the attempt did not

    layer = PermissionMiddleware(lambda call: PermissionAsk("sure?"), resolver=dismissed)
    result = await run_pipeline([layer], FakeCore(), make_call("rm"))
    assert result.output == "Permission cancelled while awaiting approval for tool 'rm'"
    assert result.is_error is True


async def test_permission_attempt_cancellation_while_waiting_propagates() -> None:
    waiting = asyncio.Event()

    async def slow_human(prompt: str, call: MiddlewareCall) -> bool:
        waiting.set()
        await asyncio.sleep(10)
        return True

    layer = PermissionMiddleware(lambda call: PermissionAsk("sure?"), resolver=slow_human)
    task = asyncio.create_task(run_pipeline([layer], FakeCore(), make_call()))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_permission_policy_sees_the_call_and_bad_decisions_raise() -> None:
    seen: list[MiddlewareCall] = []

    def policy(call: MiddlewareCall) -> PermissionDecision:
        seen.append(call)
        return "yes"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="PermissionAllow"):
        await run_pipeline([PermissionMiddleware(policy)], FakeCore(), make_call("x", {"a": 1}))
    assert (seen[0].tool_name, seen[0].arguments) == ("x", {"a": 1})


# -- OutputLimitMiddleware -----------------------------------------------------------------


async def limited(max_chars: int, output: str | list[Part], **kw: Any) -> MiddlewareResult:
    return await run_pipeline(
        [OutputLimitMiddleware(max_chars)], FakeCore(output, **kw), make_call()
    )


async def test_output_limit_keeps_short_text() -> None:
    assert (await limited(20, "short")).output == "short"
    assert (await limited(5, "exact")).output == "exact"


async def test_output_limit_cuts_the_head_and_counts_the_marker() -> None:
    text = "0123456789" * 10
    result = await limited(30, text)
    assert isinstance(result.output, str)
    assert len(result.output) == 30
    assert result.output == text[: 30 - len(TRUNCATION_MARKER)] + "\n[truncated]"
    assert TRUNCATION_MARKER == "\n[truncated]"


async def test_output_limit_counts_characters_not_bytes() -> None:
    text = "é" * 50
    result = await limited(20, text)
    assert result.output == "é" * 8 + "\n[truncated]"


async def test_output_limit_zero_disables() -> None:
    text = "x" * 10_000
    assert (await limited(0, text)).output == text


async def test_output_limit_budget_smaller_than_the_marker() -> None:
    result = await limited(5, "0123456789")
    assert result.output == "\n[tru"


async def test_output_limit_applies_to_errors_and_keeps_fields() -> None:
    result = await limited(15, "e" * 40, is_error=True, duration_ms=7.0)
    assert result.output == "eee\n[truncated]"
    assert (result.is_error, result.duration_ms) == (True, 7.0)


async def test_output_limit_multipart_shares_the_budget_in_order() -> None:
    image = ImagePart("image/png", "AAAA")
    parts: list[Part] = [TextPart("a" * 10), image, TextPart("b" * 30), TextPart("c" * 5)]
    result = await limited(25, parts)
    # 10 chars of "a", then 25 - 12 - 10 = 3 chars of "b" plus the marker; "c" dropped.
    assert result.output == [TextPart("a" * 10), image, TextPart("bbb\n[truncated]")]
    small: list[Part] = [TextPart("a"), image]
    assert (await limited(25, small)).output == small


def test_output_limit_rejects_negative() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        OutputLimitMiddleware(-1)


# -- VerifyMiddleware ----------------------------------------------------------------------


async def test_verify_passed_and_failed_texts() -> None:
    ok = VerifyMiddleware(lambda call, result: (True, "looks right"))
    result = await run_pipeline([ok], FakeCore("out"), make_call())
    assert result.output == "out\n\n[verify] passed: looks right"
    assert result.is_error is False

    async def check(call: MiddlewareCall, result: MiddlewareResult) -> tuple[bool, str]:
        return False, f"{call.tool_name} wrote nothing"

    result = await run_pipeline([VerifyMiddleware(check)], FakeCore("out"), make_call("w"))
    assert result.output == "out\n\n[verify] failed: w wrote nothing"
    assert result.is_error is False  # never sets is_error


async def test_verify_keeps_an_error_an_error() -> None:
    layer = VerifyMiddleware(lambda call, result: (True, "fine"))
    result = await run_pipeline([layer], FakeCore("bad", is_error=True), make_call())
    assert result.output == "bad\n\n[verify] passed: fine"
    assert result.is_error is True


async def test_verify_multipart_gets_an_extra_text_part() -> None:
    layer = VerifyMiddleware(lambda call, result: (False, "no image"))
    result = await run_pipeline([layer], FakeCore([TextPart("t")]), make_call())
    assert result.output == [TextPart("t"), TextPart("[verify] failed: no image")]


async def test_verify_check_that_raises_is_a_failed_verification() -> None:
    def broken(call: MiddlewareCall, result: MiddlewareResult) -> tuple[bool, str]:
        raise ValueError("oops")

    result = await run_pipeline([VerifyMiddleware(broken)], FakeCore("out"), make_call())
    assert result.output == "out\n\n[verify] failed: check raised ValueError: oops"
    assert result.is_error is False


# -- RedactingMiddleware -------------------------------------------------------------------

PATTERNS: dict[str, str | re.Pattern[str]] = {
    "email": r"[\w.+-]+@[\w-]+\.[\w.]+",
    "api_key": re.compile(r"sk-[A-Za-z0-9]{8,}"),
}


async def test_redacting_replaces_each_match() -> None:
    layer = RedactingMiddleware(PATTERNS)
    output = "mail bob@example.com or ann@x.org with key sk-ABCDEFGH1234"
    result = await run_pipeline([layer], FakeCore(output), make_call())
    assert result.output == (
        "mail [REDACTED:email] or [REDACTED:email] with key [REDACTED:api_key]"
    )


def test_redact_text_is_exposed_for_the_audit() -> None:
    layer = RedactingMiddleware(PATTERNS)
    assert layer.redact_text("to: bob@example.com") == "to: [REDACTED:email]"
    assert layer.redact_text("nothing here") == "nothing here"
    assert layer.redact_value({"to": ["bob@example.com", 3], "n": None}) == {
        "to": ["[REDACTED:email]", 3],
        "n": None,
    }


def test_redacting_never_rewrites_its_own_markers() -> None:
    layer = RedactingMiddleware({"secret": r"s3cr3t", "word": r"[A-Za-z:]+"})
    assert layer.redact_text("s3cr3t") == "[REDACTED:secret]"


def test_redacting_ignores_empty_matches() -> None:
    layer = RedactingMiddleware({"digits": r"\d*"})
    assert layer.redact_text("ab 123 c") == "ab [REDACTED:digits] c"


async def test_redacting_multipart_text_parts_only() -> None:
    image = ImagePart("image/png", "bob@example.com")
    layer = RedactingMiddleware(PATTERNS)
    result = await run_pipeline(
        [layer], FakeCore([TextPart("hi bob@example.com"), image]), make_call()
    )
    assert result.output == [TextPart("hi [REDACTED:email]"), image]


# -- UnknownToolMiddleware (spec §3.3, scenario 9) -------------------------------------------


@tool
async def bash(command: str = "") -> str:
    """Run a command."""
    return command


async def dispatch_unknown(name: str, layers: list[Middleware]) -> MiddlewareResult:
    registry = ToolRegistry([bash])
    call = make_call(name, registry_names=tuple(registry.names()))
    return await run_pipeline(layers, ToolCallMiddleware(registry), call)


async def test_did_you_mean_scenario_9() -> None:
    result = await dispatch_unknown("basj", [UnknownToolMiddleware()])
    assert result.output == "Tool not found: basj. Available: bash. Did you mean 'bash'?"
    assert result.is_error is True

    result = await dispatch_unknown("xyz", [UnknownToolMiddleware()])
    assert result.output == "Tool not found: xyz. Available: bash"


async def test_did_you_mean_uses_the_name_after_inner_layers() -> None:
    # The outer layer saw "bash", but an inner layer renamed it to "basj" before the core.
    result = await dispatch_unknown("bash", [UnknownToolMiddleware(), renamer("basj")])
    assert result.output == "Tool not found: basj. Available: bash. Did you mean 'bash'?"


async def test_did_you_mean_only_for_text_not_found_errors() -> None:
    layer = UnknownToolMiddleware()
    names = ("bash",)
    cases: list[tuple[str | list[Part], bool]] = [
        ("Tool not found: basj", False),  # not an error
        ("file not found", True),  # no "tool"
        ("tool failed", True),  # no "not found"
        ([TextPart("Tool not found: basj")], True),  # not text
    ]
    for output, is_error in cases:
        core = FakeCore(output, is_error=is_error)
        result = await run_pipeline([layer], core, make_call("basj", registry_names=names))
        assert result.output == output
    core = FakeCore("TOOL 'basj' NOT FOUND", is_error=True)
    result = await run_pipeline([layer], core, make_call("basj", registry_names=names))
    assert result.output == "TOOL 'basj' NOT FOUND. Did you mean 'bash'?"


async def test_did_you_mean_ties_keep_the_first_sorted_name() -> None:
    core = FakeCore("Tool not found: ab", is_error=True)
    call = make_call("ab", registry_names=("ad", "ac"))
    result = await run_pipeline([UnknownToolMiddleware()], core, call)
    assert result.output == "Tool not found: ab. Did you mean 'ac'?"


async def test_did_you_mean_skips_a_registered_name() -> None:
    core = FakeCore("tool 'bash' panicked: file not found", is_error=True)
    call = make_call("bash", registry_names=("bash",))
    result = await run_pipeline([UnknownToolMiddleware()], core, call)
    assert result.output == "tool 'bash' panicked: file not found"


def test_unknown_tool_threshold() -> None:
    assert UnknownToolMiddleware().threshold == 0.4
    assert UnknownToolMiddleware.with_threshold(0.7).threshold == 0.7
    assert UnknownToolMiddleware.with_threshold(3.0).threshold == 1.0
    assert UnknownToolMiddleware.with_threshold(-1.0).threshold == 0.0
    assert UnknownToolMiddleware().with_threshold(0.5).threshold == 0.5
    with pytest.raises(ValueError, match="NaN"):
        UnknownToolMiddleware(float("nan"))


async def test_unknown_tool_threshold_gates_the_suggestion() -> None:
    strict = UnknownToolMiddleware.with_threshold(0.9)
    result = await dispatch_unknown("basj", [strict])
    assert result.output == "Tool not found: basj. Available: bash"
    lenient = UnknownToolMiddleware.with_threshold(0.0)
    assert (await dispatch_unknown("xyz", [lenient])).output == (
        "Tool not found: xyz. Available: bash"
    )


# -- layers together ---------------------------------------------------------------------------


async def test_recommended_stack_order_is_observable() -> None:
    # OutputLimit outermost cuts what Unknown appended; registered the other way round the
    # suggestion would be appended after the cut.
    limit = OutputLimitMiddleware(40)
    unknown = UnknownToolMiddleware()
    outer_limit = await dispatch_unknown("basj", [limit, unknown])
    inner_limit = await dispatch_unknown("basj", [unknown, limit])
    assert isinstance(outer_limit.output, str)
    assert len(outer_limit.output) == 40
    assert outer_limit.output.endswith(TRUNCATION_MARKER)
    assert inner_limit.output == "Tool not found: basj. Available: bash. Did you mean 'bash'?"
    assert len("Tool not found: basj. Available: bash") < 40


async def test_permission_outside_redaction_and_verify() -> None:
    verify = VerifyMiddleware(lambda call, result: (True, "checked"))
    redact = RedactingMiddleware({"email": r"\S+@\S+"})
    permit = PermissionMiddleware(lambda call: PermissionAllow())
    result = await run_pipeline([permit, verify, redact], FakeCore("to a@b.c"), make_call())
    assert result.output == "to [REDACTED:email]\n\n[verify] passed: checked"
