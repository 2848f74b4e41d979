"""Pure unit tests of tooltrail.core.detection: loop detection (pipeline spec §10), no Temporal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tooltrail.core.config import LoopDetection
from tooltrail.core.detection import (
    DEFAULT_SUGGESTION,
    LoopCheck,
    LoopDetector,
    Operation,
    operation_for,
)

DEFAULTS = LoopDetection()
SAME_OUTPUT_HASH = "d386446a8c87ac99"  # stable_hash("same output"), fixed across processes


def op(tool: str, param: str, result_hash: str | None = "h1") -> Operation:
    return Operation(tool=tool, param=param, result_hash=result_hash)


def detector_with(*ops: Operation, config: LoopDetection = DEFAULTS) -> LoopDetector:
    detector = LoopDetector()
    for item in ops:
        detector.record(item, config)
    return detector


# -- operation identity (§10.2) --------------------------------------------------------------


def test_operation_for_uses_the_canonical_json_of_the_whole_input_by_default():
    operation = operation_for("t", {"b": 1, "a": "é"}, "same output")
    assert operation == Operation(tool="t", param='{"a":"é","b":1}', result_hash=SAME_OUTPUT_HASH)


def test_operation_for_prefers_the_primary_param():
    operation = operation_for("read", {"path": "/x", "n": 1}, "same output", primary_param="/x")
    assert operation == Operation(tool="read", param="/x", result_hash=SAME_OUTPUT_HASH)


def test_operation_for_empty_output_has_no_hash():
    assert operation_for("t", {}, "") == Operation(tool="t", param="{}", result_hash=None)


def test_operations_are_identical_only_when_all_three_fields_are_equal():
    base = op("t", "p", "h1")
    assert base == op("t", "p", "h1")
    assert base != op("u", "p", "h1")
    assert base != op("t", "q", "h1")
    assert base != op("t", "p", "h2")
    assert base != op("t", "p", None)


def test_operation_is_frozen():
    with pytest.raises(ValueError, match="frozen"):
        op("t", "p").tool = "u"  # type: ignore[misc]


# -- the §10.4 timeline (scenario 25) --------------------------------------------------------


def test_identical_calls_warn_from_the_4th_pre_check_and_stop_the_11th():
    operation = operation_for("t", {"q": "x"}, "same output")
    detector = LoopDetector()
    checks: list[LoopCheck] = []
    for _ in range(10):
        check = detector.check(DEFAULTS)
        checks.append(check)
        assert not check.should_stop
        detector.record(operation, DEFAULTS)

    assert checks[:3] == [LoopCheck()] * 3
    for call, check in enumerate(checks[3:], start=4):
        assert check.pattern == 't({"q":"x"})'
        assert check.repetitions == call - 1
        assert check.candidates == (operation,)
        assert check.message is None
        assert check.error_text() is None
        assert check.refusal_text() is None

    eleventh = detector.check(DEFAULTS)
    assert eleventh == LoopCheck(
        candidates=(operation,),
        pattern='t({"q":"x"})',
        repetitions=10,
        should_stop=True,
        message='t({"q":"x"}) repeated 10 times',
    )
    assert eleventh.error_text() == 'Loop detected: t({"q":"x"}) repeated 10 times'
    assert eleventh.refusal_text() == (
        'dispatch refused before execution: Loop detected: t({"q":"x"}) repeated 10 times'
    )

    detector.stop(eleventh)
    assert detector.window == []
    assert detector.warned == [operation]
    assert detector.check(DEFAULTS) == LoopCheck()


def test_the_pre_check_never_writes():
    detector = detector_with(*[op("t", "p")] * 10)
    before = detector.model_dump()
    assert detector.check(DEFAULTS).should_stop
    assert detector.check(DEFAULTS).should_stop
    assert detector.model_dump() == before
    assert detector.warned == []


def test_changing_results_never_stop():
    # Scenario 26: the same call, a different output each time, 15 calls.
    detector = LoopDetector()
    for n in range(15):
        assert detector.check(DEFAULTS) == LoopCheck()
        detector.record(operation_for("t", {"q": "x"}, f"output {n}"), DEFAULTS)
    assert len(detector.window) == 15
    assert detector.check(DEFAULTS) == LoopCheck()


def test_identical_error_texts_build_a_pattern_distinct_ones_do_not():
    # §2.2: the detector counts attempts; byte-identical failures repeat, distinct ones do not.
    flaky = detector_with(*[operation_for("f", {}, "boom")] * 3)
    assert flaky.check(DEFAULTS).pattern == "f({})"
    varied = detector_with(*(operation_for("f", {}, f"boom {n}") for n in range(3)))
    assert varied.check(DEFAULTS).pattern is None


def test_stop_threshold_zero_never_stops_but_still_reports_the_pattern():
    # Scenario 27.
    config = LoopDetection(stop_threshold=0)
    operation = op("t", "p")
    detector = LoopDetector()
    for _ in range(25):
        detector.record(operation, config)
    check = detector.check(config)
    assert check == LoopCheck(
        candidates=(operation,), pattern="t(p)", repetitions=25, should_stop=False, message=None
    )
    assert detector.end_of_run(config) is False
    assert len(detector.window) == 25


def test_distinct_inputs_with_identical_output_are_distinct_operations():
    # Scenario 29: 12 inputs, byte-identical output, 12 operations, no pattern.
    detector = LoopDetector()
    for n in range(12):
        assert detector.check(DEFAULTS) == LoopCheck()
        detector.record(operation_for("T", {"n": n}, "same output"), DEFAULTS)
    assert len(set(detector.window)) == 12
    assert [entry.param for entry in detector.window] == [f'{{"n":{n}}}' for n in range(12)]
    assert detector.check(DEFAULTS) == LoopCheck()


# -- window (§10.2) --------------------------------------------------------------------------


def test_the_window_drops_the_oldest_entries():
    config = LoopDetection(window=5)
    detector = detector_with(*(op("t", str(n)) for n in range(7)), config=config)
    assert [entry.param for entry in detector.window] == ["2", "3", "4", "5", "6"]


def test_old_counts_age_out_of_the_window():
    config = LoopDetection(window=4)
    detector = detector_with(op("t", "p"), op("t", "p"), op("t", "p"), config=config)
    assert detector.check(config).repetitions == 3
    detector.record(op("u", "q"), config)
    assert detector.check(config).repetitions == 3
    detector.record(op("u", "r"), config)
    assert detector.check(config) == LoopCheck()
    assert detector.window == [op("t", "p"), op("t", "p"), op("u", "q"), op("u", "r")]


def test_a_smaller_window_trims_to_size_on_the_next_record():
    detector = detector_with(*(op("t", str(n)) for n in range(10)))
    detector.record(op("t", "10"), LoopDetection(window=3))
    assert [entry.param for entry in detector.window] == ["8", "9", "10"]


# -- check and decision (§10.3) --------------------------------------------------------------


def test_ties_are_all_candidates_sorted_by_tool_and_param():
    detector = detector_with(
        *[op("b", "x"), op("a", "z"), op("a", "y"), op("c", "w")] * 3,
        op("c", "w", "h2"),
    )
    check = detector.check(DEFAULTS)
    assert check.candidates == (op("a", "y"), op("a", "z"), op("b", "x"), op("c", "w"))
    assert check.pattern == "a(y)"
    assert check.repetitions == 3


def test_only_the_maximum_count_is_kept():
    detector = detector_with(*[op("a", "p")] * 3, *[op("z", "p")] * 4)
    check = detector.check(DEFAULTS)
    assert check.candidates == (op("z", "p"),)
    assert check.pattern == "z(p)"
    assert check.repetitions == 4


def test_ties_at_the_stop_threshold_report_the_first_and_warn_all():
    detector = detector_with(*[op("b", "p"), op("a", "p")] * 10)
    check = detector.check(DEFAULTS)
    assert check.message == "a(p) repeated 10 times"
    detector.stop(check)
    assert detector.window == []
    assert detector.warned == [op("a", "p"), op("b", "p")]


def test_a_stop_level_pattern_anywhere_refuses_whichever_tool_is_next():
    # The check takes no tool: a stop-level pattern of `loop` refuses a call to `other`.
    detector = LoopDetector()
    for n in range(10):
        detector.record(op("loop", "p"), DEFAULTS)
        detector.record(op("other", str(n)), DEFAULTS)
    check = detector.check(DEFAULTS)
    assert check.should_stop
    assert check.message == "loop(p) repeated 10 times"


def test_sequential_stop_on_call_2_of_3_after_a_persisted_window():
    # Scenario 44 shape: 9 repeats persisted from earlier turns; call 1 records the 10th,
    # call 2's pre-check stops (call 3 never starts), and the next turn starts clean.
    stored = detector_with(*[op("t", "p")] * 9).model_dump_json()
    detector = LoopDetector.model_validate_json(stored)
    assert not detector.check(DEFAULTS).should_stop  # call 1 pre-check
    detector.record(op("t", "p"), DEFAULTS)
    check = detector.check(DEFAULTS)  # call 2 pre-check (a different tool would stop too)
    assert check.should_stop
    assert check.message == "t(p) repeated 10 times"
    detector.stop(check)
    next_turn = LoopDetector.model_validate_json(detector.model_dump_json())
    assert next_turn.check(DEFAULTS) == LoopCheck()
    assert next_turn.warned == [op("t", "p")]


def test_per_tool_thresholds_override_the_loop_threshold():
    detector = detector_with(*[op("grep", "p")] * 3, *[op("ls", "p")] * 2)
    assert detector.check(DEFAULTS).pattern == "grep(p)"
    assert detector.check(DEFAULTS, {"grep": 4}) == LoopCheck()
    check = detector.check(DEFAULTS, {"grep": 4, "ls": 2})
    assert check.candidates == (op("ls", "p"),)
    assert check.repetitions == 2


def test_a_per_tool_threshold_above_the_stop_threshold_hides_the_stop():
    detector = detector_with(*[op("t", "p")] * 10)
    assert detector.check(DEFAULTS, {"t": 11}) == LoopCheck()
    assert detector.end_of_run(DEFAULTS, {"t": 11}) is False
    assert len(detector.window) == 10


def test_disabled_detection_neither_reports_nor_records():
    config = LoopDetection(enabled=False)
    detector = detector_with(*[op("t", "p")] * 10)
    assert detector.check(config) == LoopCheck()
    detector.record(op("t", "p"), config)
    assert len(detector.window) == 10


def test_host_warning_texts():
    warn = detector_with(*[op("t", "p")] * 3).check(DEFAULTS)
    assert warn.host_warning() == (
        "Loop detected: Operation 't(p)' repeated 3 times with same result. "
        "Consider a different approach or tool."
    )
    assert warn.host_warning("Try another path.") == (
        "Loop detected: Operation 't(p)' repeated 3 times with same result. Try another path."
    )
    stop = detector_with(*[op("t", "p")] * 10).check(DEFAULTS)
    assert stop.host_warning() == (
        "Loop detected: Operation 't(p)' repeated 10 times with same result. "
        "STOPPING to prevent infinite loop. Consider a different approach or tool."
    )
    assert stop.host_warning("") == stop.host_warning(None)
    assert DEFAULT_SUGGESTION == "Consider a different approach or tool."
    assert LoopCheck().host_warning("x") is None


# -- warned set and progress flush (§10.2) ---------------------------------------------------


def test_progress_flush_only_for_warned_patterns():
    detector = detector_with(
        op("t", "p", "h1"), op("t", "p", "h2"), op("t", "q", "h1"), op("u", "p", "h1")
    )
    detector.acknowledge_loop_warning(op("t", "p", "h1"))
    detector.record(op("t", "p", "h2"), DEFAULTS)
    # The warned entry is gone; t(p) entries whose hash differs from h2 are flushed.
    assert detector.warned == []
    assert detector.window == [
        op("t", "p", "h2"),
        op("t", "q", "h1"),
        op("u", "p", "h1"),
        op("t", "p", "h2"),
    ]


def test_progress_flush_after_a_stop_lets_the_call_go_on():
    detector = detector_with(*[op("t", "p", "h1")] * 10)
    detector.stop(detector.check(DEFAULTS))
    for _ in range(3):
        detector.record(op("t", "p", "h1"), DEFAULTS)
    assert detector.check(DEFAULTS).repetitions == 3
    detector.record(op("t", "p", "h2"), DEFAULTS)
    assert detector.warned == []
    assert detector.window == [op("t", "p", "h2")]
    assert detector.check(DEFAULTS) == LoopCheck()


def test_never_warned_patterns_are_not_flushed():
    detector = detector_with(*[op("t", "p", "h1")] * 3)
    detector.record(op("t", "p", "h2"), DEFAULTS)
    assert detector.window == [*[op("t", "p", "h1")] * 3, op("t", "p", "h2")]
    assert detector.check(DEFAULTS).pattern == "t(p)"
    assert detector.check(DEFAULTS).candidates == (op("t", "p", "h1"),)


def test_a_pre_check_alone_never_warns():
    detector = detector_with(*[op("t", "p", "h1")] * 5)
    assert detector.check(DEFAULTS).pattern == "t(p)"
    detector.record(op("t", "p", "h2"), DEFAULTS)
    assert len(detector.window) == 6


def test_the_same_hash_as_the_warned_entry_does_not_flush():
    detector = detector_with(op("t", "p", "h1"), op("t", "p", "h3"))
    detector.acknowledge_loop_warning(op("t", "p", "h1"))
    detector.record(op("t", "p", "h1"), DEFAULTS)
    assert detector.warned == [op("t", "p", "h1")]
    assert detector.window == [op("t", "p", "h1"), op("t", "p", "h3"), op("t", "p", "h1")]


def test_a_flush_keeps_a_warned_entry_with_the_new_hash():
    detector = detector_with(op("t", "p", "h1"), op("t", "p", "h2"), op("t", "p", None))
    detector.acknowledge_loop_warning(op("t", "p", "h1"))
    detector.acknowledge_loop_warning(op("t", "p", "h2"))
    detector.acknowledge_loop_warning(op("t", "pp", "h1"))
    detector.record(op("t", "p", "h2"), DEFAULTS)
    assert detector.warned == [op("t", "p", "h2"), op("t", "pp", "h1")]
    assert detector.window == [op("t", "p", "h2"), op("t", "p", "h2")]


def test_a_flush_to_an_empty_result():
    detector = detector_with(op("t", "p", "h1"), op("u", "p", "h1"))
    detector.acknowledge_loop_warning(op("t", "p", "h1"))
    detector.record(op("t", "p", None), DEFAULTS)
    assert detector.warned == []
    assert detector.window == [op("u", "p", "h1"), op("t", "p", None)]


def test_the_warned_set_is_distinct_and_sorted():
    detector = LoopDetector()
    for item in (op("b", "p"), op("a", "q", "h2"), op("a", "q", None), op("b", "p"), op("a", "p")):
        detector.acknowledge_loop_warning(item)
    expected = [op("a", "p"), op("a", "q", None), op("a", "q", "h2"), op("b", "p")]
    assert detector.warned == expected
    loaded = LoopDetector.model_validate({"warned": [op("b", "p"), op("a", "p"), op("b", "p")]})
    assert loaded.warned == [op("a", "p"), op("b", "p")]


def test_clear_keeps_the_warned_set():
    detector = detector_with(op("t", "p"))
    detector.acknowledge_loop_warning(op("t", "p"))
    detector.clear()
    assert detector.window == []
    assert detector.warned == [op("t", "p")]


# -- run boundary (§10.4, scenario 28) -------------------------------------------------------


def test_end_of_run_clears_the_window_only_when_a_stop_would_fire():
    below = detector_with(*[op("t", "p")] * 9)
    assert below.end_of_run(DEFAULTS) is False
    assert len(below.window) == 9

    at_stop = detector_with(*[op("t", "p")] * 10, op("u", "q"))
    assert at_stop.end_of_run(DEFAULTS) is True
    assert at_stop.window == []
    assert at_stop.warned == []
    assert at_stop.check(DEFAULTS) == LoopCheck()


def test_the_next_run_after_a_loop_stop_can_dispatch_again():
    detector = detector_with(*[op("t", "p")] * 10)
    check = detector.check(DEFAULTS)
    assert check.should_stop
    detector.stop(check)
    assert detector.end_of_run(DEFAULTS) is False
    assert not detector.check(DEFAULTS).should_stop


# -- persistence and stability (§0 rules 4 and 5) --------------------------------------------


def test_json_round_trip():
    detector = detector_with(
        operation_for("t", {"q": "Zürich"}, "same output"),
        operation_for("t", {}, ""),
        op("u", "p", "h1"),
    )
    detector.acknowledge_loop_warning(op("u", "p", "h1"))
    text = detector.model_dump_json()
    assert text == (
        '{"window":[{"tool":"t","param":"{\\"q\\":\\"Zürich\\"}","result_hash":"d386446a8c87ac99"},'
        '{"tool":"t","param":"{}","result_hash":null},'
        '{"tool":"u","param":"p","result_hash":"h1"}],'
        '"warned":[{"tool":"u","param":"p","result_hash":"h1"}]}'
    )
    loaded = LoopDetector.model_validate_json(text)
    assert loaded == detector
    assert loaded.model_dump_json() == text
    check = detector_with(*[op("t", "p")] * 10).check(DEFAULTS)
    assert LoopCheck.model_validate_json(check.model_dump_json()) == check


def test_the_empty_detector_round_trips():
    assert LoopDetector().model_dump_json() == '{"window":[],"warned":[]}'
    assert LoopDetector.model_validate_json('{"window":[],"warned":[]}') == LoopDetector()


def test_detection_is_the_same_in_another_process():
    # The built-in hash() is salted per process; nothing here may depend on it.
    code = (
        "from tooltrail.core.config import LoopDetection\n"
        "from tooltrail.core.detection import LoopDetector, operation_for\n"
        "d = LoopDetector()\n"
        "for n in range(30):\n"
        "    d.record(operation_for(f't{n % 3}', {'n': n % 2}, 'same output'), LoopDetection())\n"
        "print(d.check(LoopDetection()).model_dump_json())\n"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        outputs.add(done.stdout.strip())
    candidates = ",".join(
        f'{{"tool":"t{t}","param":"{{\\"n\\":{n}}}","result_hash":"{SAME_OUTPUT_HASH}"}}'
        for t in range(3)
        for n in range(2)
    )
    assert outputs == {
        f'{{"candidates":[{candidates}],"pattern":"t0({{\\"n\\":0}})","repetitions":5,'
        '"should_stop":false,"message":null}'
    }
