"""The turn's trail: the numbered event stream, its batches, and the final write.

Every event gets its ``seq`` here, so the audit trail's order is fixed by the history. The
records are written in batches by a local activity (see ``RunConfig.audit_interval_s``), so
they never enter the history and cost no round trip of their own: during the turn when one
is due (best effort), and when the turn ends, where the turn's final status and the session
state go last (that write insists). Deterministic code only.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from tooltrail.core.wire import (
    AUDIT_RECORD,
    AuditEvent,
    Flush,
    MemoryEntry,
    RecordTurn,
    TurnStatus,
)
from tooltrail.workflows.failures import raise_if_cancelled_activity
from tooltrail.workflows.state import TurnState

__all__ = ["Trail", "json_size"]

# The final audit write must not be lost: it retries until it lands, however long the
# database is down (every failed try is logged by the worker). A retry policy of a local
# activity is the worker's business: no command of the history depends on it.
_RECORD_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
)
_BATCH_DEADLINE = timedelta(seconds=5)
"""How long a best-effort batch may hold its turn: a database that hangs (a lock held, a
server that accepts connections and answers nothing) costs a turn this much per batch at
most; the records wait for the next one."""
_BATCH_EVENTS = 200
"""Pending events that make the next tool call write a batch, however recent the last."""
_FLUSH_BUDGET = 256 * 1024
"""Bytes of audit records one batch carries at most (the rest follow with the next one)."""


def json_size(value: Any) -> int:
    """Bytes of ``value`` as JSON (UTF-8)."""
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))


class Trail:
    """Numbers the turn's events and writes its records (the state's ``trail`` part)."""

    def __init__(self, state: TurnState) -> None:
        """Keep the turn's state; the trail's bookkeeping is ``state.trail``."""
        self._state = state
        self._book = state.trail

    @property
    def started(self) -> bool:
        """Whether any event was emitted (``turn_started`` is always ``seq`` 0)."""
        return self._book.next_seq > 0

    def emit(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        call_id: str | None = None,
        tool: str | None = None,
        attempt: int | None = None,
        at: datetime | None = None,
        temporal_attempt: int | None = None,
        worker: str | None = None,
    ) -> AuditEvent:
        """Append the next event of the stream; return it."""
        event = AuditEvent(
            seq=self._book.next_seq,
            kind=kind,
            tool_call_id=call_id,
            tool_name=tool,
            attempt=attempt,
            payload=payload,
            created_at=at or workflow.now(),
            temporal_attempt=temporal_attempt,
            worker=worker,
        )
        self._book.next_seq += 1
        self._book.events.append(event)
        return event

    def remember(self, entry: MemoryEntry) -> None:
        """Keep a memory entry for the next write."""
        self._book.memory.append(entry)

    def _take(self) -> Flush:
        """Take the pending records and mark them in flight.

        One write at a time (``checkpoint`` waits while records are in flight) keeps the
        writes, and so the observers' deliveries, in ``seq`` order even when the calls of a
        wave run concurrently.
        """
        book, record = self._book, self._state.record
        # A byte budget keeps every write's input far below Temporal's payload limit; what
        # does not fit goes with the next write (always at least one record).
        events: list[AuditEvent] = []
        budget = _FLUSH_BUDGET
        for event in book.events:
            budget -= json_size(event.payload)
            if events and budget < 0:
                break
            events.append(event)
        flush = Flush(
            turn_id=record.turn_id,
            session_id=record.session_id,
            # The turn's row travels only when it changed since it was last written.
            turn=None if record == book.record_written else record,
            events=events,
            memory=list(book.memory),
        )
        book.in_flight.update(e.seq for e in flush.events)
        book.in_flight.update(-1 - m.seq for m in flush.memory)
        return flush

    def _settle(self, flush: Flush, *, written: bool = True) -> None:
        """Drop written records; records whose write failed are sent again later."""
        book = self._book
        events = {event.seq for event in flush.events}
        memory = {entry.seq for entry in flush.memory}
        book.in_flight.difference_update(events)
        book.in_flight.difference_update(-1 - seq for seq in memory)
        if written:
            if flush.turn is not None:
                book.record_written = flush.turn
            book.events = [e for e in book.events if e.seq not in events]
            book.memory = [m for m in book.memory if m.seq not in memory]

    async def checkpoint(self, *, force: bool = False) -> None:
        """Write the pending records in one batch, when due (see ``audit_interval_s``).

        Best effort: with the database down the records stay pending for the next batch,
        and the turn goes on (the final write is the one that insists).
        """
        book = self._book
        if book.in_flight or not (book.events or book.memory):
            return
        interval = timedelta(seconds=self._state.input.config.audit_interval_s)
        if not (
            force
            or len(book.events) >= _BATCH_EVENTS
            or workflow.now() - book.last_write >= interval
        ):
            return
        flush = self._take()
        written = False
        try:
            answer = await workflow.execute_local_activity(
                AUDIT_RECORD,
                RecordTurn(flush=flush, must_persist=False),
                # A string is the chain head of the records written (older workers: True).
                result_type=bool | str,  # type: ignore[arg-type]
                start_to_close_timeout=_BATCH_DEADLINE,
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            written = answer is not False
            self._keep_head(answer)
        except (ActivityError, ApplicationError):
            # Cancelled while writing: a backoff timer or an approval wait must not follow.
            raise_if_cancelled_activity()
            workflow.logger.warning("audit batch not written; it goes with the next one")
        finally:
            self._settle(flush, written=written)
        book.last_write = workflow.now()

    @property
    def head(self) -> str:
        """The hash chain digest of the last record written (empty: none known)."""
        return self._book.head

    def _keep_head(self, answer: object) -> None:
        # Writes go one at a time in seq order: the latest answer is the run's head so far.
        if isinstance(answer, str) and answer:
            self._book.head = answer

    async def finish(self, status: TurnStatus, error: BaseException | None = None) -> None:
        """Write everything still pending with the turn's final status (retried until done)."""
        state = self._state
        state.record = state.record.model_copy(
            update={
                "status": status,
                "ended_at": workflow.now(),
                "error": None if error is None else (str(error) or type(error).__name__),
                "error_type": None if error is None else type(error).__name__,
            }
        )
        self._book.in_flight.clear()  # nothing else runs any more: send everything pending
        await self._final_batches()

    async def _final_batches(self) -> None:
        """Write everything still pending, the turn's final row and the session state last.

        Local activities: no server round trip of their own, and only their (empty) results
        enter the history, never the records. On replay the records are rebuilt from the
        history; the writes are idempotent (by turn id and seq), so a re-run is safe.
        """
        state, book = self._state, self._book
        while True:
            flush = self._take()
            last = len(flush.events) == len(book.events) and len(flush.memory) == len(book.memory)
            if last:
                flush = flush.model_copy(
                    update={"session": state.final_session(), "conversation": state.conversation}
                )
            else:
                # The final status waits for the last batch, so a turn marked ended in the
                # database has its whole trail; a first write still creates the row.
                running = None
                if book.record_written is None:
                    running = state.record.model_copy(
                        update={
                            "status": "running",
                            "ended_at": None,
                            "error": None,
                            "error_type": None,
                        }
                    )
                flush = flush.model_copy(update={"turn": running})
            try:
                answer = await workflow.execute_local_activity(
                    AUDIT_RECORD,
                    RecordTurn(flush=flush),
                    result_type=bool | str,  # type: ignore[arg-type]
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=_RECORD_RETRY,
                )
                self._keep_head(answer)
            finally:
                book.in_flight.clear()
            self._settle(flush)
            if last:
                return
