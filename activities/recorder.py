"""The audit batch writer: the turn's records, written in batches off the hot path.

``Recorder`` serves the ``tooltrail.audit.record`` local activity and the activities that
write a turn's final records; it pauses best-effort batches while the database fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from tooltrail.core.wire import Flush
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.middleware import RedactingMiddleware
from tooltrail.pipeline.observers import deliver
from tooltrail.pipeline.redaction import redact_flush, redact_value

__all__ = ["BATCH_DEADLINE_S", "BATCH_PAUSE_S", "Recorder"]

log = logging.getLogger("tooltrail.tool")


BATCH_DEADLINE_S = 2.0
"""How long a best-effort batch (``must_persist=False``) may take on the worker before it
counts as failed: below the workflow's own deadline for the batch, so the worker, not
Temporal's timeout, decides, and learns that the database hangs."""
BATCH_PAUSE_S = (5.0, 60.0)
"""After a best-effort batch failed or timed out, the worker answers further best-effort
batches "not written" at once for this long: the first pause, doubled after each failure up
to the second figure. A database that hangs so costs the worker's turns one deadline per
pause, not one per batch; the records wait for the next batch or the turn's final write."""


class Recorder:
    """Writes the workflow's pending records and hands the events to the host's observers."""

    def __init__(
        self,
        store: AuditStore,
        observers: Sequence[object] = (),
        redactors: Sequence[RedactingMiddleware] = (),
        *,
        batch_deadline_s: float = BATCH_DEADLINE_S,
        batch_pause_s: tuple[float, float] = BATCH_PAUSE_S,
    ) -> None:
        """Wire the audit store, the observers, and the redactors of what gets stored.

        Args:
            store: the audit database.
            observers: the host's observers.
            redactors: the redacting layers whose rules apply to what is stored.
            batch_deadline_s: see ``BATCH_DEADLINE_S``.
            batch_pause_s: see ``BATCH_PAUSE_S``.
        """
        self.store = store
        self.observers = list(observers)
        self.redactors = list(redactors)
        self.batch_deadline_s = batch_deadline_s
        self.batch_pause_s = batch_pause_s
        self._pause_s = 0.0
        self._paused_until = 0.0
        """``time.monotonic()`` before which best-effort batches are not tried."""

    @property
    def batches_paused(self) -> bool:
        """Whether best-effort batches are answered "not written" without a try, for now."""
        return time.monotonic() < self._paused_until

    def _batch_failed(self) -> None:
        first, longest = self.batch_pause_s
        self._pause_s = min(longest, self._pause_s * 2 if self._pause_s else first)
        self._paused_until = time.monotonic() + self._pause_s

    def _database_answered(self) -> None:
        self._pause_s = 0.0
        self._paused_until = 0.0

    def _redacted(self, flush: Flush) -> Flush:
        # Secrets the host redacts for the model must not land in the audit database either
        # (the call's input, the turn's error, the session's state), nor reach the observers.
        return redact_flush(flush, self.redactors)

    async def put_blob(self, key: str, value: Any, size: int) -> None:
        """Store a large output or raw value, redacted as the audit trail is."""
        await self.store.put_blob(key, redact_value(value, self.redactors), size)

    async def write(self, flush: Flush | None, *, must_persist: bool = False) -> bool:
        """Write (then deliver) the records; return False when the database write failed.

        Args:
            flush: the records, or ``None``.
            must_persist: raise instead of returning False (so Temporal retries the write).
        """
        return (await self.write_chained(flush, must_persist=must_persist)) is not False

    async def write_chained(self, flush: Flush | None, *, must_persist: bool = False) -> bool | str:
        """As ``write``, but a write of events returns its run's hash chain head so far."""
        if flush is None:
            return True
        if self.redactors:
            flush = self._redacted(flush)
        written: bool | str = True
        if must_persist:
            # The turn's final write insists (Temporal retries it until the database answers).
            written = await self.store.write_flush(flush) or True
            self._database_answered()
        elif self.batches_paused:
            # A recent batch failed or hung: this one would most likely hold its turn for
            # the whole deadline too. Its records wait in the workflow for a later write.
            written = False
            log.debug("audit batch of turn %r not tried: batches paused", flush.turn_id)
        else:
            started = time.monotonic()
            try:
                head = await asyncio.wait_for(self.store.write_flush(flush), self.batch_deadline_s)
                written = head or True
                self._database_answered()
            except asyncio.CancelledError:
                if time.monotonic() - started >= self.batch_deadline_s:
                    # Hung past the deadline, its cancellation too (the activity's timeout).
                    self._batch_failed()
                raise
            except Exception:  # TimeoutError included: a database that hangs
                written = False
                self._batch_failed()
                log.warning(
                    "audit write failed for turn %r; the workflow will send the records again"
                    " (best-effort batches paused for %.0f s)",
                    flush.turn_id,
                    self._pause_s,
                    exc_info=True,
                )
        if self.observers and flush.events:
            # At least once: records sent again after a failed write are delivered again.
            await deliver(
                self.observers,
                turn_id=flush.turn_id,
                session_id=flush.session_id,
                events=flush.events,
            )
        return written
