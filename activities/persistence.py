"""Activities that write the audit trail and manage sessions."""

from __future__ import annotations

from temporalio import activity

from tooltrail.activities.local_only import refuse_unless_local
from tooltrail.activities.recorder import Recorder
from tooltrail.core.wire import AUDIT_RECORD, SESSION_CLEANUP, CloseSessionInput, RecordTurn
from tooltrail.tools.scratch import ScratchDirs

__all__ = ["AuditActivities", "SessionActivities"]


class AuditActivities:
    """Writes the turn's audit records: in batches during the turn, and at its end."""

    def __init__(self, recorder: Recorder) -> None:
        """Wire the audit recorder."""
        self.recorder = recorder

    @activity.defn(name=AUDIT_RECORD)
    async def record(self, inp: RecordTurn) -> bool | str:
        """Write the records; return whether they were written.

        A write of events returns the digest of the last instead of ``True``: the run's hash
        chain head so far, which the workflow keeps as the anchor its result carries.

        With ``must_persist`` (the end of a turn) a database error propagates, so Temporal
        retries the write; otherwise it is logged and the workflow sends the records again.

        Raises:
            ApplicationError: scheduled as a regular activity (by a foreign workflow: every
                tooltrail workflow writes its trail through a local activity).
        """
        refuse_unless_local(AUDIT_RECORD)
        flush = inp.flush
        if not flush.run_id:
            # The run writes its own branch of the trail (a reset's run never overwrites the
            # records of the run it branched from); the workflow leaves it out of its input.
            flush = flush.model_copy(update={"run_id": activity.info().workflow_run_id or ""})
        return await self.recorder.write_chained(flush, must_persist=inp.must_persist)


class SessionActivities:
    """Session lifecycle on the worker host."""

    def __init__(self, scratch: ScratchDirs) -> None:
        """Wire the scratch directories."""
        self.scratch = scratch

    @activity.defn(name=SESSION_CLEANUP)
    async def cleanup(self, inp: CloseSessionInput) -> bool:
        """Remove the session's scratch directory (best-effort); return whether one existed."""
        return self.scratch.remove(inp.session_id)
