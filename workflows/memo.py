"""The memoize cache's part in one call (pipeline spec §12): hits and what is kept.

Memoize registered first serves hits in the workflow (``memo_hit``); registered after other
layers, the hit travels to the tool activity and is served at its place (``memo_in_place``).
Deterministic code only.
"""

from __future__ import annotations

from typing import Any, assert_never

from temporalio import workflow

from tooltrail.core.memoize import MEMO_CACHE_BYTES, MemoEntry, with_cached_marker
from tooltrail.core.results import ToolCall
from tooltrail.core.wire import AttemptResult, InfraFailed, MemoHit, MemoSeen, Ran, ShadowServed
from tooltrail.workflows.state import TurnState

__all__ = ["MEMO_IN_PLACE", "memo_hit", "memo_in_place", "memo_update"]

MEMO_IN_PLACE = "memo-in-registration-order"
"""Patch: a memoize layer not registered first serves its hits in the tool activity, at its
place (histories before it served every hit in the workflow)."""

_MEMO_BUDGET_PATCH = "tooltrail-memo-budget"
"""Patch: the memo cache keeps at most ``MEMO_CACHE_BYTES`` of outputs."""


def memo_hit(state: TurnState, tool_name: str, arguments: dict[str, Any]) -> MemoHit | None:
    """The hit the workflow serves itself (memoize registered first), if any."""
    plan = state.plan.memo
    if plan is None or state.input.shadow is not None:
        return None
    if not plan.outermost and workflow.patched(MEMO_IN_PLACE):
        return None  # served in the activity, at the layer's place (memo_in_place)
    entry = state.memo.lookup(plan, tool_name, arguments, state.session_version)
    if entry is None:
        return None
    return MemoHit(
        output=with_cached_marker(entry.output),
        is_error=False,
        duration_ms=entry.duration_ms,  # the hit replays the original call's duration
        resolved_tool_name=entry.resolved_tool_name,
        display_hint=entry.display_hint,
    )


def memo_in_place(state: TurnState, tool_name: str, arguments: dict[str, Any]) -> MemoEntry | None:
    """The hit a memoize layer not registered first serves at its place, if any."""
    plan = state.plan.memo
    if plan is None or plan.outermost or state.input.shadow is not None:
        return None
    if not workflow.patched(MEMO_IN_PLACE):
        return None
    return state.memo.lookup(plan, tool_name, arguments, state.session_version)


def memo_update(
    state: TurnState,
    call: ToolCall,
    tool_name: str,
    arguments: dict[str, Any],
    outcome: AttemptResult,
) -> None:
    """Keep what a successful attempt returned in the session's memo cache."""
    plan = state.plan.memo
    if plan is None or outcome.is_error or state.input.shadow is not None:
        return
    kept: MemoSeen | AttemptResult = outcome
    match outcome:
        case MemoHit() | Ran(memo_served=True):
            return  # served from the cache: nothing new to keep
        case Ran() if not plan.outermost and workflow.patched(MEMO_IN_PLACE):
            # What the layer saw come back from inside it: the layers before it apply
            # again to every hit, so their output must not be cached.
            if outcome.memo_seen is None:
                return  # stopped before the layer, or too large for the history
            kept = outcome.memo_seen
        case Ran(output_ref=str()):
            return  # a large output stays in the database, not in the cache
        case Ran() | ShadowServed() | InfraFailed():
            pass
        case _:
            assert_never(outcome)
    paths = state.plan.memo_paths.get(call.id, [])
    state.memo.written(plan, tool_name, paths)
    state.memo.remember(
        plan,
        tool=tool_name,
        arguments=arguments,
        output=kept.output,
        duration_ms=kept.duration_ms,
        resolved_tool_name=kept.resolved_tool_name or tool_name,
        display_hint=kept.display_hint,
        turn=state.session_version,
        paths=paths,
    )
    if state.memo.over(MEMO_CACHE_BYTES) and workflow.patched(_MEMO_BUDGET_PATCH):
        state.memo.trim(MEMO_CACHE_BYTES)  # session state stays small (oldest go first)
