"""Pure unit tests of tooltrail.core.recovery: strategy decisions (pipeline spec §6.2, §6.3)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from tooltrail import (
    MAX_RECOVERY_ATTEMPTS,
    AlwaysRecoverable,
    Analysis,
    ExponentialBackoff,
    FixedDelay,
    InputFix,
    NoopReflector,
    NoRetry,
    ReflectionContext,
    Reflector,
    RetryForever,
    RunConfig,
    ToolChange,
)
from tooltrail.core.recovery import Action, AskUser, Fail, Retry, Skip

ENGINE_MAX = 5  # the engine always tells the strategy max_attempts=5 (spec §6.1)


def recoverable(severity: Any = "medium", correction: Any = None, cause: str = "boom") -> Analysis:
    return Analysis(is_recoverable=True, root_cause=cause, severity=severity, correction=correction)


def not_recoverable(cause: str = "boom", **kw: Any) -> Analysis:
    return Analysis(is_recoverable=False, root_cause=cause, **kw)


# -- constants and defaults ------------------------------------------------------------------


def test_max_recovery_attempts_is_five():
    assert MAX_RECOVERY_ATTEMPTS == 5


def test_exponential_backoff_defaults():
    s = ExponentialBackoff()
    assert (s.max_retries, s.base_delay_ms, s.max_delay_ms) == (3, 100, 30_000)
    assert s.kind == "exponential_backoff"


def test_run_config_default_recovery_is_exponential_backoff():
    assert RunConfig().recovery == ExponentialBackoff()


def test_analysis_defaults():
    a = Analysis(is_recoverable=True, root_cause="x")
    assert a.severity == "medium"
    assert a.correction is None
    assert a.context == ""


def test_severity_must_be_known():
    with pytest.raises(ValidationError):
        Analysis(is_recoverable=True, root_cause="x", severity="fatal")


@pytest.mark.parametrize("field", ["max_retries", "base_delay_ms", "max_delay_ms"])
def test_exponential_backoff_refuses_negative_settings(field):
    with pytest.raises(ValidationError):
        ExponentialBackoff(**{field: -1})


# -- ExponentialBackoff.decide, rule by rule -------------------------------------------------


def test_rule_1_not_recoverable_fails_with_the_root_cause():
    assert ExponentialBackoff().decide(not_recoverable("disk full"), 0, ENGINE_MAX) == Fail(
        reason="disk full"
    )


def test_rule_1_wins_over_every_later_rule():
    # Out of retries, high severity with a correction: still rule 1.
    analysis = not_recoverable("nope", severity="critical", correction=InputFix(modified_input={}))
    assert ExponentialBackoff().decide(analysis, 99, ENGINE_MAX) == Fail(reason="nope")


def test_default_delays_then_fail():
    s = ExponentialBackoff()
    a = recoverable()
    assert [s.decide(a, attempt, ENGINE_MAX) for attempt in range(4)] == [
        Retry(delay_ms=100),
        Retry(delay_ms=200),
        Retry(delay_ms=400),
        Fail(reason="max retries (3) exceeded"),
    ]


def test_rule_2_past_the_last_retry_still_fails():
    assert ExponentialBackoff().decide(recoverable(), 4, ENGINE_MAX) == Fail(
        reason="max retries (3) exceeded"
    )


def test_rule_2_uses_the_smaller_of_max_retries_and_max_attempts():
    s = ExponentialBackoff(max_retries=10)
    a = recoverable()
    assert s.decide(a, 4, ENGINE_MAX) == Retry(delay_ms=1_600)
    assert s.decide(a, 5, ENGINE_MAX) == Fail(reason="max retries (5) exceeded")


def test_rule_2_with_max_attempts_zero_fails_at_once():
    assert ExponentialBackoff().decide(recoverable(), 0, 0) == Fail(
        reason="max retries (0) exceeded"
    )


def test_rule_2_with_zero_retries_fails_at_once():
    assert ExponentialBackoff(max_retries=0).decide(recoverable(), 0, ENGINE_MAX) == Fail(
        reason="max retries (0) exceeded"
    )


def test_rule_2_wins_over_rule_3():
    a = recoverable(severity="critical", correction=InputFix(modified_input={"a": 1}))
    assert ExponentialBackoff().decide(a, 3, ENGINE_MAX) == Fail(reason="max retries (3) exceeded")


@pytest.mark.parametrize("severity", ["high", "critical"])
@pytest.mark.parametrize(
    "correction", [InputFix(modified_input={"path": "/ok"}), ToolChange(alternative_tool="b")]
)
def test_rule_3_high_severity_with_a_correction_asks_the_user(severity, correction):
    a = recoverable(severity=severity, correction=correction, cause="wrong path")
    assert ExponentialBackoff().decide(a, 0, ENGINE_MAX) == AskUser(
        prompt="high-severity failure with correction available: wrong path"
    )


@pytest.mark.parametrize("severity", ["high", "critical"])
def test_rule_3_high_severity_without_a_correction_retries(severity):
    a = recoverable(severity=severity)
    assert ExponentialBackoff().decide(a, 1, ENGINE_MAX) == Retry(delay_ms=200)


@pytest.mark.parametrize("severity", ["low", "medium"])
def test_rule_3_lower_severity_with_a_correction_retries(severity):
    a = recoverable(severity=severity, correction=InputFix(modified_input={"x": 1}))
    assert ExponentialBackoff().decide(a, 2, ENGINE_MAX) == Retry(delay_ms=400)


def test_rule_3_correction_counts_even_when_empty():
    # A correction object with no payload is still "a correction present".
    a = recoverable(severity="high", correction=InputFix())
    assert isinstance(ExponentialBackoff().decide(a, 0, ENGINE_MAX), AskUser)


def test_rule_4_custom_base():
    s = ExponentialBackoff(max_retries=5, base_delay_ms=250)
    a = recoverable()
    assert [s.decide(a, i, ENGINE_MAX).delay_ms for i in range(5)] == [  # type: ignore[union-attr]
        250,
        500,
        1_000,
        2_000,
        4_000,
    ]


def test_rule_4_caps_at_max_delay():
    s = ExponentialBackoff(max_retries=100)
    a = recoverable()
    # 100 * 2**8 = 25_600 is under the cap; 100 * 2**9 = 51_200 is over it.
    assert s.decide(a, 8, 100) == Retry(delay_ms=25_600)
    assert s.decide(a, 9, 100) == Retry(delay_ms=30_000)
    assert s.decide(a, 40, 100) == Retry(delay_ms=30_000)


def test_rule_4_custom_cap():
    s = ExponentialBackoff(max_retries=4, base_delay_ms=100, max_delay_ms=300)
    a = recoverable()
    assert [s.decide(a, i, ENGINE_MAX) for i in range(4)] == [
        Retry(delay_ms=100),
        Retry(delay_ms=200),
        Retry(delay_ms=300),
        Retry(delay_ms=300),
    ]


@pytest.mark.parametrize("attempt", [62, 63, 64, 1_000, 10**6])
def test_rule_4_saturates_for_huge_attempts(attempt):
    s = ExponentialBackoff(max_retries=10**9)
    assert s.decide(recoverable(), attempt, 10**9) == Retry(delay_ms=30_000)


@pytest.mark.parametrize("attempt", [0, 5, 62, 63, 10**6])
def test_rule_4_zero_base_always_gives_zero(attempt):
    s = ExponentialBackoff(max_retries=10**9, base_delay_ms=0)
    assert s.decide(recoverable(), attempt, 10**9) == Retry(delay_ms=0)


def test_rule_4_delay_is_a_whole_number_of_milliseconds():
    action = ExponentialBackoff().decide(recoverable(), 2, ENGINE_MAX)
    assert isinstance(action, Retry)
    assert type(action.delay_ms) is int


# -- other strategies ------------------------------------------------------------------------


def test_fixed_delay():
    s = FixedDelay(max_retries=2, delay_ms=50)
    a = recoverable()
    assert [s.decide(a, i, ENGINE_MAX) for i in range(3)] == [
        Retry(delay_ms=50),
        Retry(delay_ms=50),
        Fail(reason="max retries (2) exceeded"),
    ]
    assert s.decide(not_recoverable("bad"), 0, ENGINE_MAX) == Fail(reason="bad")


def test_fixed_delay_respects_max_attempts():
    s = FixedDelay(max_retries=10, delay_ms=0)
    assert s.decide(recoverable(), 5, ENGINE_MAX) == Fail(reason="max retries (5) exceeded")


def test_fixed_delay_needs_both_settings():
    with pytest.raises(ValidationError):
        FixedDelay(max_retries=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("attempt", [0, 5, 6, 100])
def test_retry_forever_always_retries(attempt):
    s = RetryForever()
    assert s.delay_ms == 0
    assert s.decide(recoverable(), attempt, ENGINE_MAX) == Retry(delay_ms=0)
    assert s.decide(not_recoverable(), attempt, ENGINE_MAX) == Retry(delay_ms=0)
    assert RetryForever(delay_ms=7).decide(not_recoverable(), attempt, 0) == Retry(delay_ms=7)


@pytest.mark.parametrize("analysis", [recoverable("high", InputFix(modified_input={})), None])
def test_no_retry_always_fails_with_the_root_cause(analysis):
    a = analysis or not_recoverable("why")
    assert NoRetry().decide(a, 0, ENGINE_MAX) == Fail(reason=a.root_cause)


# -- actions and their wire form -------------------------------------------------------------


def test_actions_are_tagged():
    adapter: TypeAdapter[Any] = TypeAdapter(Action)
    for action in (Retry(delay_ms=5), Skip(reason="s"), AskUser(prompt="p"), Fail(reason="f")):
        assert adapter.validate_json(adapter.dump_json(action)) == action
    assert adapter.dump_python(Retry(delay_ms=5)) == {"kind": "retry", "delay_ms": 5}


def test_action_defaults():
    assert Retry().delay_ms == 0
    assert Skip().reason == ""
    assert AskUser().prompt == ""
    assert Fail().reason == ""


def test_correction_round_trips_inside_an_analysis():
    a = recoverable("high", ToolChange(alternative_tool="b"))
    again = Analysis.model_validate_json(a.model_dump_json())
    assert again == a
    assert isinstance(again.correction, ToolChange)
    b = Analysis.model_validate(
        {
            "is_recoverable": True,
            "root_cause": "x",
            "correction": {"kind": "input_fix", "modified_input": {"path": "/ok"}},
        }
    )
    assert b.correction == InputFix(modified_input={"path": "/ok"})


# -- built-in reflectors ---------------------------------------------------------------------


def _context() -> ReflectionContext:
    return ReflectionContext(
        error="tool 'p' panicked: x",
        tool="p",
        arguments={"a": 1},
        schema={"type": "object"},
        attempt=2,
    )


def test_reflection_context_defaults_and_alias():
    ctx = _context()
    assert ctx.max_attempts == 5
    assert ctx.task == ""
    assert ctx.schema == ctx.schema_ == {"type": "object"}
    assert ReflectionContext(error="e", tool="t", arguments={}, attempt=0).schema is None
    # The old keyword still works, and the field dumps under its contract name.
    old = ReflectionContext(error="e", tool="t", arguments={}, attempt=0, schema_={"a": 1})
    assert old.schema == {"a": 1} and old.model_dump()["schema"] == {"a": 1}
    assert ReflectionContext.model_validate(ctx.model_dump()).schema == {"type": "object"}


async def test_noop_reflector_says_not_recoverable():
    analysis = await NoopReflector().analyze(_context())
    assert analysis == Analysis(
        is_recoverable=False,
        root_cause="tool 'p' panicked: x",
        severity="medium",
        correction=None,
        context="",
    )
    # With the default strategy this means no retry at all.
    assert ExponentialBackoff().decide(analysis, 0, ENGINE_MAX) == Fail(
        reason="tool 'p' panicked: x"
    )


async def test_always_recoverable_reflector():
    analysis = await AlwaysRecoverable().analyze(_context())
    assert analysis == Analysis(
        is_recoverable=True, root_cause="tool 'p' panicked: x", severity="medium"
    )
    assert ExponentialBackoff().decide(analysis, 0, ENGINE_MAX) == Retry(delay_ms=100)


def test_builtin_reflectors_satisfy_the_protocol():
    assert isinstance(NoopReflector(), Reflector)
    assert isinstance(AlwaysRecoverable(), Reflector)


# -- RunConfig carries the strategy through JSON ---------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        ExponentialBackoff(),
        ExponentialBackoff(max_retries=10, base_delay_ms=5, max_delay_ms=60),
        FixedDelay(max_retries=2, delay_ms=50),
        RetryForever(delay_ms=3),
        NoRetry(),
    ],
)
def test_run_config_round_trips_the_strategy(strategy):
    config = RunConfig(recovery=strategy)
    again = RunConfig.model_validate_json(config.model_dump_json())
    assert type(again.recovery) is type(strategy)
    assert again.recovery == strategy
    assert again == config


def test_run_config_reads_a_strategy_by_kind():
    config = RunConfig.model_validate(
        {"recovery": {"kind": "fixed_delay", "max_retries": 1, "delay_ms": 9}}
    )
    assert config.recovery == FixedDelay(max_retries=1, delay_ms=9)


def test_run_config_refuses_an_unknown_strategy_kind():
    with pytest.raises(ValidationError):
        RunConfig.model_validate({"recovery": {"kind": "pray"}})
