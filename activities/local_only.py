"""Activities a foreign workflow must not schedule: only tooltrail's own, as local activities.

A regular activity's task can come from any workflow of the namespace (anyone who can start
a workflow can schedule ``tooltrail.audit.record`` on tooltrail's task queue), a local
activity's only from the workflow code running in this worker. The audit writes, the turn's
plan and the approval proofs are local activities in every tooltrail workflow, so a regular
task of theirs was scheduled by someone else and is refused before it does anything.
"""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.exceptions import ApplicationError

__all__ = ["NOT_LOCAL", "refuse_unless_local"]

NOT_LOCAL = "NotALocalActivity"
"""``ApplicationError`` type of the refusal."""

log = logging.getLogger("tooltrail.worker")


def refuse_unless_local(name: str) -> None:
    """Refuse a regular activity task of ``name`` (non-retryable), before it does anything.

    Raises:
        ApplicationError: the activity runs as a regular one.
    """
    info = activity.info()
    if info.is_local:
        return
    text = (
        f"{name} runs only as a local activity of tooltrail's own workflows; workflow "
        f"{info.workflow_id!r} ({info.workflow_type}) scheduled it on task queue "
        f"{info.task_queue!r}: refused"
    )
    log.warning("%s", text)
    raise ApplicationError(text, type=NOT_LOCAL, non_retryable=True)
