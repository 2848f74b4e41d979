"""The wire envelopes: compact on the way out, whole on the way in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from tooltrail.dispatcher import DispatchRecord
from tooltrail.results import ToolDispatchResult
from tooltrail.wire import (
    DISPATCH_FIELDS,
    AttemptOutcome,
    ExecuteAttempt,
    Flush,
    TurnOutput,
    TurnRecord,
    pack_dispatch,
    unpack_dispatch,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def through_temporal(value: Any, type_hint: type) -> tuple[bytes, Any]:
    """Encode as the worker does; return the bytes and the decoded value."""
    converter = pydantic_data_converter.payload_converter
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
    assert set(pack_dispatch(record(), **CONTEXT)) == {"status", "started_at", "finished_at"}


def test_extra_keys_and_whole_records_pass_through() -> None:
    full = {**record(value=None), "value_ref": "abc"}
    assert unpack_dispatch(pack_dispatch(full, **CONTEXT), **CONTEXT) == full
    # A record from an older worker (a recorded history) carries everything: kept as is.
    assert unpack_dispatch(full, **CONTEXT) == full


def test_outcomes_leave_their_defaults_out_and_get_them_back() -> None:
    outcome = AttemptOutcome(output="hi", is_error=False, duration_ms=1.5, resolved_tool_name="e")
    data, decoded = through_temporal(outcome, AttemptOutcome)
    assert data == b'{"output":"hi","is_error":false,"duration_ms":1.5,"resolved_tool_name":"e"}'
    assert decoded == outcome
    # A value equal to its default is left out whether it was set or not.
    flagged = outcome.model_copy(update={"breaker_refused": True, "post_hook_errors": ["x"]})
    data, decoded = through_temporal(flagged, AttemptOutcome)
    assert b'"breaker_refused":true' in data
    assert decoded == flagged


def test_a_flush_without_a_turn_row_keeps_its_ids() -> None:
    turn = TurnRecord(turn_id="t1", session_id="s1", started_at=NOW, call_count=1)
    _, old_style = through_temporal({"turn": turn.model_dump(mode="json")}, Flush)
    assert (old_style.turn_id, old_style.session_id) == ("t1", "s1")
    request = ExecuteAttempt(
        turn_id="t1",
        session_id="s1",
        tool_call_id="c1",
        tool_name="echo",
        arguments={},
        attempt=0,
        flush=Flush(turn_id="t1", session_id="s1"),
    )
    data, decoded = through_temporal(request, ExecuteAttempt)
    assert b'"flush":{"turn_id":"t1","session_id":"s1"}' in data
    assert decoded == request


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
    assert decoded == output
    # The results' own dumps (audit payloads) keep every field.
    assert "output_ref" in output.results[0].model_dump(mode="json")
