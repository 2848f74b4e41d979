"""The wave planner (spec §9.4), including a property test."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tooltrail.core.planner import CallVerdict, plan_waves


def safe(key: str | None = None) -> CallVerdict:
    return CallVerdict(safe=True, key=key)


UNSAFE = CallVerdict(safe=False)


def test_worked_example_1() -> None:
    plan = plan_waves([safe("a"), safe("b"), UNSAFE, safe(), safe("a"), safe()])
    assert plan == [[0, 1, 3, 5], [2], [4]]


def test_worked_example_2_unsafe_calls_are_not_barriers() -> None:
    assert plan_waves([safe("a"), UNSAFE, safe("b")]) == [[0, 2], [1]]


def test_unsafe_then_safe() -> None:
    assert plan_waves([UNSAFE, safe()]) == [[0], [1]]


def test_resource_chain() -> None:
    assert plan_waves([safe("/a"), safe("/a"), safe("/b")]) == [[0, 2], [1]]
    assert plan_waves([safe("k"), safe("k"), safe("k")]) == [[0], [1], [2]]


def test_edges() -> None:
    assert plan_waves([]) == []
    assert plan_waves([safe(), safe(), safe(), safe()]) == [[0, 1, 2, 3]]
    assert plan_waves([UNSAFE, UNSAFE]) == [[0], [1]]


verdicts = st.lists(
    st.one_of(
        st.just(UNSAFE),
        st.builds(
            CallVerdict, safe=st.just(True), key=st.one_of(st.none(), st.sampled_from("abc"))
        ),
    ),
    max_size=30,
)


def reference_plan(verdicts: list[CallVerdict]) -> list[list[int]]:
    """The spec's rule as written (quadratic): the O(n) planner must plan exactly so."""
    waves: list[list[int]] = []
    keys: list[set[str]] = []
    is_open: list[bool] = []
    for position, verdict in enumerate(verdicts):
        if not verdict.safe:
            waves.append([position])
            keys.append(set())
            is_open.append(False)
            continue
        target = next(
            (
                w
                for w in range(len(waves))
                if is_open[w] and (verdict.key is None or verdict.key not in keys[w])
            ),
            None,
        )
        if target is None:
            waves.append([])
            keys.append(set())
            is_open.append(True)
            target = len(waves) - 1
        waves[target].append(position)
        if verdict.key is not None:
            keys[target].add(verdict.key)
    return waves


@given(verdicts)
def test_the_planner_plans_as_the_spec_rule(calls: list[CallVerdict]) -> None:
    assert plan_waves(calls) == reference_plan(calls)


def plan_counting_lines(calls: list[CallVerdict]) -> tuple[list[list[int]], int]:
    """Plan ``calls``; return the plan and how many lines of ``plan_waves`` ran: its work,
    counted exactly (a clock would also count the machine's load)."""
    ran = 0

    def count(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal ran
        ran += event == "line"
        return count

    def calls_of_the_planner(frame: FrameType, event: str, arg: object) -> Any:
        return count if frame.f_code is plan_waves.__code__ else None

    previous = sys.gettrace()
    sys.settrace(calls_of_the_planner)
    try:
        plan = plan_waves(calls)
    finally:
        sys.settrace(previous)
    return plan, ran


def test_ten_thousand_calls_plan_well_inside_the_deadlock_detector() -> None:
    mixed = [
        UNSAFE if i % 7 == 0 else safe(None if i % 3 == 0 else f"k{i % 50}") for i in range(10_000)
    ]
    one_key = [safe("same")] * 10_000
    for calls in (mixed, one_key, [safe()] * 10_000, [safe(f"k{i}") for i in range(10_000)]):
        plan, ran = plan_counting_lines(calls)
        # The bound that matters is Temporal's deadlock detector (2 s for a workflow task):
        # the quadratic planner (which scanned the open waves for each call) took 1.8 s here.
        # A few lines per call, whatever the keys, keeps 10,000 calls in milliseconds.
        assert ran <= 12 * len(calls), f"{ran} planner lines for {len(calls)} calls"
        assert sum(len(wave) for wave in plan) == 10_000
    assert plan_waves(mixed[:500]) == reference_plan(mixed[:500])


@given(verdicts)
def test_plan_properties(calls: list[CallVerdict]) -> None:
    plan = plan_waves(calls)
    positions = [p for wave in plan for p in wave]
    assert sorted(positions) == list(range(len(calls))), "every call in exactly one wave"
    for wave in plan:
        assert wave == sorted(wave), "model order inside a wave"
        keys = [calls[p].key for p in wave if calls[p].key is not None]
        assert len(keys) == len(set(keys)), "no wave holds two equal keys"
        if any(not calls[p].safe for p in wave):
            assert len(wave) == 1, "unsafe calls run alone"
