"""Where the runs of one turn part: a reset's run repeats its base's records up to a point.

Pure functions over audit records (no I/O), used by ``tooltrail audit show``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tooltrail.core.wire import AuditEvent

__all__ = ["branch_point"]


def _content(event: AuditEvent) -> tuple[object, ...]:
    # Workflow time differs in a re-executed workflow task even where nothing else does.
    return (event.kind, event.tool_call_id, event.tool_name, event.attempt, event.payload)


def branch_point(earlier: Sequence[AuditEvent], later: Sequence[AuditEvent]) -> int:
    """The first ``seq`` at which ``later``'s records differ from ``earlier``'s.

    Records below it are the same in both runs (rebuilt from the shared part of the
    history); from it on, ``later`` has its own.
    """
    by_seq = {event.seq: event for event in earlier}
    seq = 0
    for event in sorted(later, key=lambda e: e.seq):
        base = by_seq.get(event.seq)
        if event.seq != seq or base is None or _content(base) != _content(event):
            return seq
        seq += 1
    return seq
