"""The wire envelopes: compact in the history, whole everywhere else.

What an envelope leaves unsaid is the data converter's business (``tooltrail.core.envelopes``,
``tooltrail.runtime.converter``): on the wire its defaults are left out, in ``model_dump()`` every
field is said.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from tooltrail.core.config import LARGE_OUTPUT_BYTES
from tooltrail.core.envelopes import (
    DISPATCH_FIELDS,
    ENVELOPES,
    left_out,
    open_outcome,
    pack_dispatch,
    seal_outcome,
    unpack_dispatch,
)
from tooltrail.core.hooks import HookDecision
from tooltrail.core.results import ToolCall, ToolDispatchResult
from tooltrail.core.wire import (
    AttemptOutcome,
    BreakerRefused,
    ExecuteAttempt,
    HookRefused,
    HooksPassed,
    Ran,
    ShadowServed,
    TurnInput,
    TurnOutput,
)
from tooltrail.pipeline.dispatcher import DispatchRecord
from tooltrail.runtime.converter import wire_data_converter

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def through_temporal(value: Any, type_hint: Any) -> tuple[bytes, Any]:
    """Encode as the worker does; return the bytes and the decoded value."""
    converter = wire_data_converter.payload_converter
    (payload,) = converter.to_payloads([value])
    (decoded,) = converter.from_payloads([payload], [type_hint])
    return payload.data, decoded


def record(**changes: Any) -> dict[str, Any]:
    base = DispatchRecord(
        call_id="c1",
        attempt=1,
        tool_name="echo",
        tool_kind="static",
        principal_id=None,
        raw_arguments={"text": "hi"},
        effective_arguments='{"text":"hi"}',
        status="ok",
        value="hi",
        started_at=NOW,
        finished_at=NOW,
    )
    return base.model_copy(update=changes).model_dump(mode="json")


def test_dispatch_fields_follow_the_record() -> None:
    assert list(DISPATCH_FIELDS) == list(DispatchRecord.model_fields)


CONTEXT: dict[str, Any] = {
    "call_id": "c1",
    "attempt": 0,
    "tool_name": "echo",
    "arguments": {"text": "hi"},
    "output": "hi",
}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"principal_id": "alice", "idempotency_key": "k1", "ignored_arguments": ["x"]},
        {"raw_arguments": {"text": "hi", "x": 1}, "effective_arguments": '{"text":"hi"}'},
        {"status": "tool_error", "text": "boom", "value": None},
        {"tool_kind": "dynamic", "effective_arguments": None, "attempt": 3},
        {"source_call_id": "c0", "lease_lost": True, "status": "cache_hit"},
    ],
)
def test_a_packed_dispatch_record_unpacks_to_the_same_record(changes: dict[str, Any]) -> None:
    full = record(**changes)
    packed = pack_dispatch(full, **CONTEXT)
    assert unpack_dispatch(packed, **CONTEXT) == full
    assert list(unpack_dispatch(packed, **CONTEXT)) == list(full)


def test_packing_leaves_only_what_the_workflow_cannot_know() -> None:
    assert set(pack_dispatch(record(), **CONTEXT)) == {"started_at", "finished_at"}


def test_extra_keys_and_whole_records_pass_through() -> None:
    full = {**record(value=None), "value_ref": "abc"}
    assert unpack_dispatch(pack_dispatch(full, **CONTEXT), **CONTEXT) == full
    # A whole record (nothing implied left out) comes back as it is.
    assert unpack_dispatch(full, **CONTEXT) == full


def test_outcomes_leave_their_defaults_out_and_get_them_back() -> None:
    outcome = Ran(output="hi", is_error=True, duration_ms=1.5, resolved_tool_name="e")
    data, decoded = through_temporal(outcome, AttemptOutcome)
    assert data == b'{"output":"hi","is_error":true,"duration_ms":1.5,"resolved_tool_name":"e"}'
    assert decoded == outcome
    # A value equal to its default is left out whether it was set or not.
    flagged = outcome.model_copy(update={"post_hook_errors": ["x"], "display_hint": None})
    data, decoded = through_temporal(flagged, AttemptOutcome)
    assert b'"post_hook_errors":["x"]' in data
    assert b"display_hint" not in data
    assert decoded == flagged


@pytest.mark.parametrize(
    ("outcome", "wire"),
    [
        (Ran(output="hi"), b'{"output":"hi"}'),
        (
            ShadowServed(output="x", is_error=True, reflector="noop"),
            b'{"output":"x","is_error":true,"kind":"shadow","reflector":"noop"}',
        ),
        (
            HookRefused(hook=HookDecision(decision="block", text="no", hook="H#0")),
            b'{"kind":"hook_refused","hook":{"decision":"block","text":"no","hook":"H#0"}}',
        ),
        (HooksPassed(), b'{"kind":"hooks_passed"}'),
        (BreakerRefused(), b'{"kind":"breaker_refused"}'),
    ],
)
def test_each_outcome_says_its_kind_except_the_common_one(
    outcome: AttemptOutcome, wire: bytes
) -> None:
    data, decoded = through_temporal(outcome, AttemptOutcome)
    assert data == wire
    assert type(decoded) is type(outcome)
    assert decoded == outcome


def test_turn_results_leave_unset_optionals_out() -> None:
    output = TurnOutput(
        turn_id="t1",
        results=[
            ToolDispatchResult(
                tool_call_id="a", output="x", is_error=False, duration_ms=1, resolved_tool_name="e"
            ),
            ToolDispatchResult(
                tool_call_id="b",
                output="y",
                is_error=True,
                duration_ms=0,
                resolved_tool_name="e",
                display_hint="list",
            ),
        ],
    )
    data, decoded = through_temporal(output, TurnOutput)
    assert b"output_ref" not in data
    assert data.count(b"display_hint") == 1
    assert data.count(b"is_error") == 2  # the turn's public result says the rest
    assert decoded == output
    # The results' own dumps (audit payloads) keep every field.
    assert "output_ref" in output.results[0].model_dump(mode="json")


STARTED = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
DISPATCHED = record(
    started_at=STARTED + timedelta(microseconds=159), finished_at=STARTED + timedelta(seconds=1)
)


REQUEST = ExecuteAttempt(
    session_id="s1", tool_call_id="c1", tool_name="echo", arguments={"text": "hi"}
)


def ran(**changes: Any) -> Ran:
    """An attempt's outcome as the tool activity makes it, with a dispatch record."""
    base = Ran(
        output="hi",
        duration_ms=0.427,
        resolved_tool_name="echo",
        reflector="noop",
        started_at=STARTED,
        finished_at=STARTED + timedelta(microseconds=704),
        dispatch=DISPATCHED,
    )
    return base.model_copy(update=changes)


def round_trip(outcome: Ran) -> tuple[bytes, AttemptOutcome]:
    """Through the activity's seal, the converter and the workflow's open."""
    data, decoded = through_temporal(seal_outcome(outcome, REQUEST), AttemptOutcome)
    return data, open_outcome(decoded, REQUEST)


def test_an_outcomes_times_travel_as_microseconds_and_come_back_exact() -> None:
    outcome = ran()
    data, decoded = round_trip(outcome)
    # Left unsaid: the requested tool's name, a success's reflector, the implied dispatch.
    assert data == b'{"output":"hi","dispatch":{},"t":[1795953600123456,704,427,159,1000000]}'
    assert decoded == outcome.model_copy(update={"reflector": None})
    assert isinstance(decoded, Ran)
    assert decoded.dispatch == DISPATCHED
    assert list(decoded.dispatch or {}) == list(DISPATCHED)
    assert (decoded.dispatch or {})["started_at"] == "2026-11-29T12:00:00.123615Z"


def test_a_failures_reflector_and_another_tool_are_said() -> None:
    outcome = ran(is_error=True, resolved_tool_name="other", dispatch=None)
    data, decoded = round_trip(outcome)
    assert b'"reflector":"noop"' in data
    assert b'"resolved_tool_name":"other"' in data
    assert decoded == outcome


def test_model_dump_says_every_field() -> None:
    # The compaction lives in the converter only: dumps (audit payloads, logs) say it all.
    outcome = Ran(output="hi")
    assert set(outcome.model_dump()) == set(Ran.model_fields)
    assert outcome.model_dump()["kind"] == "ran"
    request = ExecuteAttempt(session_id="s", tool_call_id="c", tool_name="t", arguments={})
    assert request.model_dump()["large_output_bytes"] == LARGE_OUTPUT_BYTES
    result = ToolDispatchResult(
        tool_call_id="a", output="x", is_error=False, duration_ms=1, resolved_tool_name="e"
    )
    assert (
        TurnOutput(turn_id="t", results=[result]).model_dump()["results"][0]["output_ref"] is None
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"duration_ms": 0.4271},  # finer than microseconds: the float stays as it is
        {"started_at": datetime(2026, 11, 29, 13, 0, tzinfo=timezone(timedelta(hours=1)))},
        {"finished_at": None},
        {"dispatch": None},
        {"dispatch": {"status": "ok", "started_at": "2026-11-29T12:00:00+00:00"}},
        {"dispatch": {"started_at": "2026-11-29T12:00:00.5Z", "finished_at": "soon"}},
    ],
)
def test_times_that_do_not_pack_exactly_travel_as_they_are(changes: dict[str, Any]) -> None:
    outcome = ran(is_error=True, **changes)
    _, decoded = round_trip(outcome)
    if isinstance(outcome.dispatch, dict) and isinstance(decoded, Ran):
        # The request's implied fields join a partial record; what it said comes back as is.
        assert {k: v for k, v in (decoded.dispatch or {}).items() if k in outcome.dispatch} == (
            outcome.dispatch
        )
        decoded = decoded.model_copy(update={"dispatch": outcome.dispatch})
    assert decoded == outcome


def test_an_outcome_without_a_tag_is_a_ran_attempt() -> None:
    # Only the common kind leaves its tag unsaid; every other kind says it (see above).
    _, decoded = through_temporal(
        {"output": "x", "is_error": True, "resolved_tool_name": "e", "reflector": "custom"},
        AttemptOutcome,
    )
    assert isinstance(decoded, Ran)
    assert (decoded.output, decoded.is_error, decoded.reflector) == ("x", True, "custom")


def test_the_attempt_request_leaves_its_turn_and_first_attempt_unsaid() -> None:
    request = ExecuteAttempt(session_id="s1", tool_call_id="c1", tool_name="e", arguments={})
    data, decoded = through_temporal(request, ExecuteAttempt)
    assert data == b'{"session_id":"s1","tool_call_id":"c1","tool_name":"e","arguments":{}}'
    assert (decoded.turn_id, decoded.attempt) == ("", 0)
    # A turn that keeps every output in the history says so.
    keep_all = request.model_copy(update={"large_output_bytes": 0})
    data, decoded = through_temporal(keep_all, ExecuteAttempt)
    assert b'"large_output_bytes":0' in data
    assert decoded.large_output_bytes == 0


def test_a_turn_input_leaves_what_it_does_not_use_out() -> None:
    turn = TurnInput(session_id="s1", calls=[ToolCall("c1", "e", {})], advertised=["e"])
    data, decoded = through_temporal(turn, TurnInput)
    # What the worker decides (the tools, the verdicts, the session's state) is not in it.
    assert set(json.loads(data)) == {"session_id", "calls", "advertised", "config"}
    assert b'"config":{' in data  # nested settings travel whole, defaults and all
    assert decoded == turn


# -- the envelopes' defaults: part of the wire format ----------------------------------------

# Each envelope and the fields it leaves out when they hold these values. A recorded history
# decodes a left-out field to today's default: changing one of these changes what every
# recorded history says (and how it replays), so it needs a new field instead.
PINNED_DEFAULTS: dict[str, dict[str, Any]] = {
    "TurnInput": {
        "advertised": None,
        "ends_run": False,
        "rerun_of": None,
        "shadow": None,
        "model": None,
    },
    "TurnPlan": {
        "advertised": None,
        "tools": {},
        "verdicts": None,
        "memo": None,
        "memo_paths": {},
    },
    "TurnOutput": {"assistant": None, "usage": None, "stop_reason": None, "trail_head": ""},
    "ToolDispatchResult": {"display_hint": None, "output_ref": None},
    "ExecuteAttempt": {
        "turn_id": "",
        "attempt": 0,
        "turn_number": 0,
        "skip_pre_hooks": False,
        "approval_proof": "",
        "large_output_bytes": 262144,
        "hooks_only": False,
        "shadow": False,
        "recorded": None,
        "memo": None,
    },
    "Ran": {
        "is_error": False,
        "duration_ms": 0.0,
        "resolved_tool_name": "",
        "display_hint": None,
        "kind": "ran",
        "reflector": None,
        "started_at": None,
        "finished_at": None,
        "dispatch": None,
        "output_ref": None,
        "output_hash": None,
        "output_preview": None,
        "post_hook_errors": [],
        "memo_served": False,
        "memo_seen": None,
        "temporal_attempt": 1,
        "worker": "",
        "lost_attempts": [],
    },
    "ShadowServed": {
        "is_error": False,
        "duration_ms": 0.0,
        "resolved_tool_name": "",
        "display_hint": None,
        "reflector": None,
    },
    "HookRefused": {},
    "HooksPassed": {},
    "BreakerRefused": {},
    "RecordTurn": {"must_persist": True},
    "Flush": {
        "turn": None,
        "events": [],
        "memory": [],
        "session": None,
        "conversation": None,
        "run_id": "",
    },
}


def test_every_envelopes_left_out_defaults_are_pinned() -> None:
    assert {cls.__name__: left_out(cls) for cls in ENVELOPES} == PINNED_DEFAULTS


@pytest.mark.parametrize("cls", ENVELOPES, ids=lambda cls: cls.__name__)
def test_an_envelope_of_defaults_says_only_what_it_must(cls: type[BaseModel]) -> None:
    # Build the envelope from its required fields; the wire then holds those (and tags).
    required = {
        "TurnInput": {"session_id": "s", "calls": []},
        "TurnOutput": {"turn_id": "t", "results": []},
        "ToolDispatchResult": {
            "tool_call_id": "c",
            "output": "x",
            "is_error": False,
            "duration_ms": 0,
            "resolved_tool_name": "e",
        },
        "ExecuteAttempt": {
            "session_id": "s",
            "tool_call_id": "c",
            "tool_name": "e",
            "arguments": {},
        },
        "Ran": {"output": "x"},
        "ShadowServed": {"output": "x"},
        "HookRefused": {"hook": {"decision": "block", "text": "no", "hook": "H#0"}},
        "RecordTurn": {"flush": {"turn_id": "t", "session_id": "s"}},
        "Flush": {"turn_id": "t", "session_id": "s"},
    }.get(cls.__name__, {})
    value = cls.model_validate(required)
    data, decoded = through_temporal(value, AttemptOutcome if cls in OUTCOMES else cls)
    said = set(json.loads(data))
    assert said.isdisjoint(PINNED_DEFAULTS[cls.__name__])
    assert said <= set(cls.model_fields)
    assert decoded == value


OUTCOMES = (Ran, ShadowServed, HookRefused, HooksPassed, BreakerRefused)
