"""The hash chain of a run's audit records.

Each record's digest covers its content and the digest of the run's previous record, so an
edited, deleted or reordered record breaks the chain.

Pure functions (no I/O): the store computes the digests as it writes, and ``verify_chain``
recomputes them from what the database holds. A chain alone cannot tell that its last
records were cut off; the head digest (the last record's) says so when it is kept where the
database cannot rewrite it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from tooltrail.core.text import canonical_json
from tooltrail.core.wire import AuditEvent

__all__ = ["GENESIS", "chain_digests", "record_content", "verify_chain"]

GENESIS = ""
"""The "previous digest" of a run's first record (``seq`` 0)."""


def _utc(value: datetime) -> str:
    # SQLite drops the zone of stored times; every time tooltrail stores is UTC.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def record_content(event: AuditEvent, run_id: str) -> dict[str, Any]:
    """What a record's digest covers: everything stored about it but its digest."""
    return {
        "run_id": run_id,
        "seq": event.seq,
        "kind": event.kind,
        "tool_call_id": event.tool_call_id,
        "tool_name": event.tool_name,
        "attempt": event.attempt,
        "temporal_attempt": event.temporal_attempt,
        "worker": event.worker,
        "payload": event.payload,
        "created_at": _utc(event.created_at),
    }


def _digest(previous: str, content: dict[str, Any]) -> str:
    text = previous + "\n" + canonical_json(content)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chain_digests(previous: str, events: Iterable[AuditEvent], run_id: str) -> list[str]:
    """The digests of consecutive records of a run.

    ``previous`` is the digest of the record before the first (``GENESIS`` before ``seq`` 0).
    """
    digests = []
    for event in events:
        previous = _digest(previous, record_content(event, run_id))
        digests.append(previous)
    return digests


def verify_chain(events: Sequence[AuditEvent], *, head: str | None = None) -> list[str]:
    """Recompute a run's chain; return each problem found (empty: the chain holds).

    Args:
        events: the run's records as stored (each with its ``run_id`` and ``digest``).
        head: the digest the run's last record must have, when known from outside the
            database; without it a chain cut short after its last stored record passes.
    """
    problems: list[str] = []
    previous = GENESIS
    for position, event in enumerate(sorted(events, key=lambda e: e.seq)):
        if event.seq != position:
            problems.append(f"seq {position} is missing (the next record is seq {event.seq})")
            return problems
        expected = _digest(previous, record_content(event, event.run_id or ""))
        if event.digest is None:
            problems.append(f"seq {event.seq} ({event.kind}) has no digest")
            return problems
        if event.digest != expected:
            problems.append(
                f"seq {event.seq} ({event.kind}) does not match its digest: "
                "it was changed, or a record before it was"
            )
            return problems
        previous = event.digest
    if head is not None and head != previous:
        problems.append(
            "the chain's last record is not its head: records were cut off or added at its end"
        )
    return problems
