"""Recovery (spec §6): strategies of users' own, Skip, and the corrections that are recorded
and skipped; on a real server, plus unit tests of the pure parts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from tests.conftest import StackFactory
from tests.support.strategies import Broken, FailWith, SkipAfter
from tooltrail import (
    AlwaysRecoverable,
    Analysis,
    ApproachChange,
    CustomStrategy,
    Escalate,
    ExponentialBackoff,
    Fail,
    Host,
    PrerequisiteFix,
    ReflectionContext,
    Retry,
    RunConfig,
    Skip,
    ToolCall,
    ToolError,
    tool,
)

runs: Counter[str] = Counter()
inputs: list[dict[str, Any]] = []


@tool
def flaky(path: str = "/bad") -> str:
    """Fail every time, numbering the executions."""
    runs["flaky"] += 1
    inputs.append({"path": path})
    raise ToolError(f"failure #{runs['flaky']}")


@pytest.fixture(autouse=True)
def reset() -> None:
    runs.clear()
    inputs.clear()


ANALYSIS = Analysis(is_recoverable=True, root_cause="boom")


def test_any_object_with_decide_is_a_strategy_and_crosses_the_wire() -> None:
    for strategy in (SkipAfter(retries=2), FailWith("no"), Broken()):
        config = RunConfig(recovery=strategy)
        assert isinstance(config.recovery, CustomStrategy)
        again = RunConfig.model_validate_json(config.model_dump_json())
        assert again.recovery == config.recovery
    assert RunConfig(recovery=SkipAfter(retries=2)).recovery.options == {"retries": 2}
    assert RunConfig(recovery=FailWith("no")).recovery.path == "tests.support.strategies:FailWith"
    # Built-ins stay what they are.
    assert isinstance(RunConfig(recovery=ExponentialBackoff()).recovery, ExponentialBackoff)


def test_custom_strategies_decide_like_the_object() -> None:
    skip = CustomStrategy.of(SkipAfter(retries=1))
    assert skip.decide(ANALYSIS, 0, 5) == Retry(delay_ms=0)
    assert skip.decide(ANALYSIS, 1, 5) == Skip(reason="skipped after 2 executions: boom")
    assert CustomStrategy.of(FailWith("no")).decide(ANALYSIS, 0, 5) == Fail(reason="no")
    # A strategy that raises (or answers nonsense) fails the call softly, never the turn.
    assert CustomStrategy.of(Broken()).decide(ANALYSIS, 0, 5) == Fail(
        reason="recovery strategy error (ValueError): broken"
    )
    nonsense = CustomStrategy(path="tests.support.strategies:FailWith", options={})
    assert nonsense.decide(ANALYSIS, 0, 5).kind == "fail"


def test_strategies_that_cannot_be_rebuilt_are_refused() -> None:
    class Local:
        def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Fail:
            return Fail()

    with pytest.raises(ValidationError, match="must be defined at module level"):
        RunConfig(recovery=Local())
    with pytest.raises(ValidationError, match="needs a decide method"):
        RunConfig(recovery=object())


def test_the_corrections_are_modelled() -> None:
    for correction in (
        PrerequisiteFix("mkdir /tmp/x"),
        ApproachChange("search first"),
        Escalate("needs a human"),
    ):
        analysis = Analysis(is_recoverable=True, root_cause="r", correction=correction)
        assert Analysis.model_validate_json(analysis.model_dump_json()) == analysis
    assert PrerequisiteFix("p").prerequisite == "p" and Escalate(reason="e").reason == "e"


async def test_a_custom_strategy_reaches_skip(stack: StackFactory) -> None:
    config = RunConfig(recovery=SkipAfter(retries=2))
    async with stack(Host([flaky], reflector=AlwaysRecoverable())) as tt:
        turn = await tt.run_turn([ToolCall("c", "flaky", {})], session_id="rs-1", config=config)
        events = await tt.audit(turn.turn_id)
    # Skip returns the failing result of the attempt it decided, byte for byte.
    assert (turn.results[0].output, turn.results[0].is_error) == ("failure #3", True)
    assert runs["flaky"] == 3
    actions = [e.payload["action"] for e in events if e.kind == "recovery_decision"]
    assert actions == [
        {"kind": "retry", "delay_ms": 0},
        {"kind": "retry", "delay_ms": 0},
        {"kind": "skip", "reason": "skipped after 3 executions: failure #3"},
    ]


class Suggests:
    """A reflector that suggests one correction of each recorded-only kind, in turn."""

    corrections = (PrerequisiteFix("create /ok"), ApproachChange("list first"), Escalate("ops"))

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        return Analysis(
            is_recoverable=True,
            root_cause=ctx.error,
            correction=self.corrections[ctx.attempt % 3],
        )


async def test_recorded_only_corrections_retry_the_call_unchanged(stack: StackFactory) -> None:
    config = RunConfig(recovery=ExponentialBackoff(max_retries=3, base_delay_ms=0))
    async with stack(Host([flaky], reflector=Suggests())) as tt:
        turn = await tt.run_turn(
            [ToolCall("c", "flaky", {"path": "/same"})], session_id="rs-2", config=config
        )
        events = await tt.audit(turn.turn_id)
    assert turn.results[0].output == "failure #4"
    assert inputs == [{"path": "/same"}] * 4
    decisions = [e.payload for e in events if e.kind == "recovery_decision"]
    assert [d["analysis"]["correction"]["kind"] for d in decisions[:3]] == [
        "prerequisite_fix",
        "approach_change",
        "escalate",
    ]
    assert decisions[0]["analysis"]["correction"]["prerequisite"] == "create /ok"
    assert [d["correction_problem"] for d in decisions] == [None] * 4
    assert [d["action"]["kind"] for d in decisions] == ["retry", "retry", "retry", "fail"]
