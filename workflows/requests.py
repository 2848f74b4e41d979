"""How one tool attempt is scheduled: its request, its timeout and Temporal's retries of it.

Deterministic code only (``tooltrail.workflows.attempt`` runs the attempt).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from tooltrail.core.memoize import MemoEntry
from tooltrail.core.results import ToolCall
from tooltrail.core.wire import ExecuteAttempt
from tooltrail.workflows.failures import TIMEOUT_NOT_RETRIED
from tooltrail.workflows.state import TurnState

__all__ = ["TIMEOUT_MARGIN", "schedule"]

TIMEOUT_MARGIN = timedelta(seconds=30)
"""Margin on top of a tool's own timeout, so the tool's soft timeout text wins over Temporal's."""


def schedule(
    state: TurnState,
    call: ToolCall,
    tool_name: str,
    arguments: dict[str, Any],
    attempt: int,
    *,
    large_output_bytes: int,
    skip_pre_hooks: bool,
    hooks_only: bool,
    memo: MemoEntry | None,
) -> tuple[ExecuteAttempt, timedelta, RetryPolicy, bool]:
    """Schedule one attempt.

    Returns:
        The attempt's request, its start-to-close timeout, Temporal's retry policy for it, and
        whether it runs as a local activity (``@tool(local=True)``).
    """
    inp = state.input
    config = inp.config
    meta = state.plan.tools.get(tool_name)
    if meta is not None and meta.timeout_s is not None:
        timeout = timedelta(seconds=meta.timeout_s) + TIMEOUT_MARGIN
    else:
        timeout = timedelta(seconds=config.tool_timeout_s)
    request = ExecuteAttempt(
        session_id=state.record.session_id,
        tool_call_id=call.id,
        tool_name=tool_name,
        arguments=arguments,
        attempt=attempt,
        skip_pre_hooks=skip_pre_hooks,
        approval_proof=state.approval_proofs.get(call.id, "") if skip_pre_hooks else "",
        hooks_only=hooks_only,
        turn_number=state.session_version,
        memo=memo,
        shadow=inp.shadow is not None,
        large_output_bytes=large_output_bytes,
        recorded=(
            inp.shadow.attempts.get(f"{call.id}#{attempt}") if inp.shadow is not None else None
        ),
    )
    retry = RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=config.infrastructure_retries,
        non_retryable_error_types=[TIMEOUT_NOT_RETRIED],
    )
    return request, timeout, retry, meta is not None and meta.local
