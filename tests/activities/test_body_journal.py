"""The attempt journal and the post-body writes (activities/body_journal.py), without Temporal.

The fault tests (tests/faults/test_body_once.py, test_same_attempt.py) show them at work on a
real server; these pin the details: what a journal round trip keeps, what is too large to
journal, which failures are retried in place.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from tooltrail.activities.body_journal import (
    JOURNAL_LIMIT_BYTES,
    AttemptJournal,
    read_journal,
    until_written,
)
from tooltrail.core.wire import Ran
from tooltrail.db.reachability import unreachable
from tooltrail.pipeline.heartbeats import BODY_STARTED
from tooltrail.tools.idempotency import IdempotencyStoreUnavailable


def _ran(output: str) -> Ran:
    return Ran(
        output=output,
        is_error=False,
        duration_ms=1.5,
        resolved_tool_name="t",
        dispatch={"status": "ok", "value": output, "lease_lost": False},
    )


def test_journal_round_trip_keeps_the_result_and_the_gate() -> None:
    journal = AttemptJournal()
    journal.body_started = True
    journal.pass_gate(send=False)  # outside an activity, nothing is sent
    assert journal.record_ran(_ran("out"))
    details = journal.details()
    assert details[0] == BODY_STARTED
    # The dispatch record's value is the output: journaled once.
    assert details[1]["ran"]["dispatch"]["value"] is None
    again = read_journal(details)
    assert again.gate_passed
    assert again.ran == _ran("out")


def test_no_journal_before_anything_happened_and_old_details_read_empty() -> None:
    assert AttemptJournal().details() == ()
    old = read_journal([BODY_STARTED])  # what attempts recorded before the journal
    assert (old.gate_passed, old.ran) == (False, None)
    assert read_journal(None).ran is None


def test_a_result_too_large_for_the_heartbeat_is_not_journaled() -> None:
    journal = AttemptJournal()
    assert not journal.record_ran(_ran("x" * JOURNAL_LIMIT_BYTES))
    assert journal.ran is None


async def test_until_written_retries_an_unreachable_database_only() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    failures: list[Exception] = [
        OperationalError("INSERT", {}, ConnectionRefusedError()),
        ConnectionRefusedError(),
        IdempotencyStoreUnavailable("down"),
    ]

    async def write() -> str:
        if failures:
            raise failures.pop(0)
        return "written"

    assert await until_written(write, what="test", sleep=sleep) == "written"
    assert sleeps == [0.2, 0.4, 0.8]

    async def refused() -> Any:
        raise IntegrityError("INSERT", {}, ValueError("value refused"))

    # A value the database refuses fails the same way forever: raised at once.
    with pytest.raises(IntegrityError):
        await until_written(refused, what="test", sleep=sleep)
    assert len(sleeps) == 3


def test_unreachable() -> None:
    assert unreachable(TimeoutError())
    assert unreachable(OSError(111, "refused"))
    assert not unreachable(ValueError("NUL"))
    assert not unreachable(IntegrityError("INSERT", {}, ValueError()))
