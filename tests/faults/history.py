"""Reading what a test needs from a workflow history and an audit trail."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import pytest
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tooltrail.core.wire import AuditEvent

__all__ = [
    "activity_attempts",
    "assert_exactly_once",
    "expected_kinds",
    "intervals",
    "local_activities",
    "max_overlap",
    "require",
]


def activity_attempts(history: WorkflowHistory, activity_type: str) -> list[int]:
    """The attempt that completed each activity of ``activity_type``, local ones included.

    Temporal writes the started event of an activity's last attempt only, so an attempt
    above 1 means earlier attempts were lost or failed. A local activity leaves one marker,
    whose data holds the attempt that completed it.
    """
    local = [
        data["attempt"]
        for data in local_activities(history)
        if data.get("activity_type") == activity_type
    ]
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    }
    return local + [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]


def local_activities(history: WorkflowHistory) -> list[dict[str, Any]]:
    """The data of every local activity's marker, in order (``activity_type``, ``attempt``...)."""
    return [
        _marker_data(e.marker_recorded_event_attributes.details["data"])
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]


def _marker_data(payloads: Payloads) -> dict[str, Any]:
    # Core writes the marker's data as one JSON payload.
    data: dict[str, Any] = json.loads(payloads.payloads[0].data)
    return data


def intervals(events: Sequence[AuditEvent]) -> dict[str, tuple[datetime, datetime]]:
    """Each call's body start and end (worker clock), from its ``tool_post`` events."""
    return {
        e.tool_call_id: (
            datetime.fromisoformat(e.payload["started_at"]),
            datetime.fromisoformat(e.payload["finished_at"]),
        )
        for e in events
        if e.tool_call_id is not None and e.kind == "tool_post" and e.payload.get("started_at")
    }


def max_overlap(spans: Sequence[tuple[datetime, datetime]]) -> int:
    """The most spans open at once."""
    points = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def expected_kinds(
    call_ids: Sequence[str], errors: Collection[str] = ()
) -> list[tuple[str, str | None]]:
    """The event stream of a sequential turn: (kind, call id) by seq.

    Calls in ``errors`` ended in a soft error, which the no-op reflector answers with a
    ``recovery_decision`` (no retry).
    """
    per_call = []
    for c in call_ids:
        per_call += [("tool_pre", c), ("tool_post", c)]
        if c in errors:
            per_call.append(("recovery_decision", c))
    return [
        ("turn_started", None),
        *[("tool_call_received", c) for c in call_ids],
        *per_call,
        ("turn_end", None),
    ]


def assert_exactly_once(
    events: Sequence[AuditEvent], call_ids: Sequence[str], errors: Collection[str] = ()
) -> None:
    """Every event of a sequential turn is there once: seq 0..N-1, kinds in order."""
    seqs = [e.seq for e in events]
    assert seqs == list(range(len(events))), f"seq not contiguous from 0: {seqs}"
    counts = Counter((e.kind, e.tool_call_id, e.attempt) for e in events)
    duplicated = {key: n for key, n in counts.items() if n > 1}
    assert not duplicated, f"events recorded more than once: {duplicated}"
    assert [(e.kind, e.tool_call_id) for e in events] == expected_kinds(call_ids, errors)


def require(condition: object, message: str) -> None:
    """Fail the test (``pytest.fail``, not ``AssertionError``) unless ``condition`` holds.

    For a test's preconditions: their failure says the scenario did not happen as planned,
    not that the property under test broke.
    """
    if not condition:
        pytest.fail(message)
