"""The state of one ``TurnWorkflow`` run, as one explicit model handed to the turn's parts.

The shell (``turn``), one call's pipeline (``attempt``) and the trail (``trail``) share
this object and nothing else: each reads and changes the fields it owns, through the
others' methods where a field is theirs (the trail's bookkeeping is the trail's).
Deterministic code only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from tooltrail.core.config import RunConfig
from tooltrail.core.detection import LoopCheck, LoopDetector
from tooltrail.core.memoize import MemoCache
from tooltrail.core.wire import (
    ApprovalInput,
    AttemptOutcome,
    AuditEvent,
    ConversationAppend,
    MemoryEntry,
    PendingApproval,
    Ran,
    SessionState,
    ShadowServed,
    TurnInput,
    TurnPlan,
    TurnRecord,
)

__all__ = ["TrailState", "TurnState"]


@dataclass
class TrailState:
    """The trail's bookkeeping: numbering, pending records, what was written."""

    last_write: datetime
    """When the last batch was written (or the turn started)."""
    next_seq: int = 0
    """The ``seq`` of the next event."""
    events: list[AuditEvent] = field(default_factory=list)
    """Events not written yet, in ``seq`` order."""
    memory: list[MemoryEntry] = field(default_factory=list)
    """Memory entries not written yet."""
    in_flight: set[int] = field(default_factory=set)
    """Records handed to an activity that has not reported yet (memory entries as -1 - seq)."""
    record_written: TurnRecord | None = None
    """The turn row as it was last written (``None``: never)."""
    head: str = ""
    """The hash chain digest of the last record written (the anchor the result carries)."""


@dataclass
class TurnState:
    """What one turn knows while it runs."""

    input: TurnInput
    """What the turn was asked (a model phase replaces its calls)."""
    record: TurnRecord
    """The turn's row as it stands now."""
    trail: TrailState
    """The trail's bookkeeping (``workflows.trail.Trail`` owns it)."""
    plan: TurnPlan = field(default_factory=TurnPlan)
    """What the worker decided for the turn's calls (tools, features, verdicts, memo)."""
    detector: LoopDetector = field(default_factory=LoopDetector)
    """The loop detector: the session's window, updated by every attempt."""
    memo: MemoCache = field(default_factory=MemoCache)
    """The session's memoize cache."""
    session_version: int = 0
    """The session state's version as the previous turn saved it."""
    acks_applied: int = 0
    """The last loop-warning acknowledgement the session's state has taken up."""
    finished: list[str] = field(default_factory=list)
    """Calls that have their result, in the order they got it."""
    waiting: dict[str, PendingApproval] = field(default_factory=dict)
    """Calls parked on a hook's ``Ask``, by call id."""
    answers: dict[str, ApprovalInput] = field(default_factory=dict)
    """Approvals received and not yet taken up, by call id."""
    used_signatures: set[str] = field(default_factory=set)
    """Fingerprints (``signature_fingerprint``) of the signed approvals this turn took up (a
    second use is a replay)."""
    approval_proofs: dict[str, str] = field(default_factory=dict)
    """The worker's proof of each call's approval, by call id (``tooltrail.core.proofs``)."""
    conversation: ConversationAppend | None = None
    """An agent turn's tool results for its run's conversation (with the final record)."""
    inline_used: int = 0
    """Bytes of tool output kept inline (or reserved by running attempts) this turn."""

    def reserve_inline(self, config: RunConfig) -> int:
        """Reserve the inline bytes one attempt's output may take; return them.

        An output is inline up to ``large_output_bytes`` and while the turn's
        ``inline_output_bytes`` last: every output sits in the turn's final trail record and
        result, so their sum must stay far below Temporal's payload limit. Running attempts
        reserve their share first, so the calls of a parallel wave cannot overspend it
        together.
        """
        left = max(0, config.inline_output_bytes - self.inline_used)
        reserved = left if config.large_output_bytes <= 0 else min(left, config.large_output_bytes)
        self.inline_used += reserved
        return reserved

    def release_inline(self, reserved: int, outcome: AttemptOutcome | None = None) -> None:
        """Give back what an attempt reserved and its outcome did not keep inline."""
        used = 0
        if isinstance(outcome, Ran | ShadowServed) and not getattr(outcome, "output_ref", None):
            used = _output_size(outcome.output)
        self.inline_used -= reserved - min(used, reserved)

    @property
    def advertised(self) -> list[str]:
        """The names advertised for the turn: the input's, or else the worker's."""
        if self.input.advertised is not None:
            return self.input.advertised
        return self.plan.advertised or []

    def loop_thresholds(self) -> dict[str, int]:
        """The tools' own loop thresholds (``@tool(loop_thresholds=...)``), by name."""
        return {
            name: meta.loop_threshold
            for name, meta in self.plan.tools.items()
            if meta.loop_threshold is not None
        }

    def loop_check(self) -> LoopCheck | None:
        """The loop pre-check (spec §10.3, a pure read); ``None`` when detection is off."""
        detection = self.input.config.detection
        if not detection.enabled:
            return None
        return self.detector.check(detection, self.loop_thresholds())

    def loop_warning(self, check: LoopCheck) -> str | None:
        """The host's warning text of a pattern, with its tool's suggestion (spec §10.3)."""
        first = check.candidates[0] if check.candidates else None
        meta = self.plan.tools.get(first.tool) if first is not None else None
        return check.host_warning(meta.loop_suggestion if meta is not None else None)

    def end_of_run(self) -> bool:
        """Apply the run boundary (spec §10.4): clear a window at stop level."""
        detection = self.input.config.detection
        if not detection.enabled:
            return False
        return self.detector.end_of_run(detection, self.loop_thresholds())

    def adopt(self, plan: TurnPlan) -> None:
        """Take up the worker's plan, and the session-scoped state the previous turn left.

        A shadow replay starts from the state the original turn started with.
        """
        self.plan = plan
        state = plan.session
        start = state.detector
        if self.input.shadow is not None:
            start = self.input.shadow.detector or type(start)()
        self.detector = start.model_copy(deep=True)
        self.memo = state.memo.model_copy(deep=True)
        self.session_version = state.version
        self.acks_applied = state.acks_applied
        if plan.memo is not None:
            self.memo.expire(plan.memo, self.session_version)

    def final_session(self) -> SessionState | None:
        """The session's state as this turn leaves it; ``None`` for a shadow (saves nothing)."""
        if self.input.shadow is not None:
            return None
        return SessionState(
            version=self.session_version + 1,
            detector=self.detector,
            memo=self.memo,
            acks_applied=self.acks_applied,
        )


def _output_size(output: str | list[Any]) -> int:
    """Bytes of an output as the activity measures it for the claim check (JSON, UTF-8)."""
    value: Any = output
    if not isinstance(output, str):
        value = [p.model_dump(mode="json") if isinstance(p, BaseModel) else p for p in output]
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return 0
    return len(text.encode("utf-8"))
