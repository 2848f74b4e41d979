"""Step 2 of the pipeline, the workflow's side: what a pre-tool hook's refusal becomes.

A ``Block`` is the answer. An ``Ask`` is refused in a non-interactive turn; in an
interactive one the call is parked until a human answers through the turn's ``approval``
Update (or the timeout passes), with the trail written first so the human can read it.
Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

from tooltrail.hooks import HookDecision, headless_ask_text
from tooltrail.results import ToolCall
from tooltrail.wire import ApprovalInput, PendingApproval
from tooltrail.workflows.state import TurnState
from tooltrail.workflows.trail import Trail

__all__ = ["Approvals"]


class Approvals:
    """Answers hook decisions, on the turn's state (its parked calls) and trail."""

    def __init__(self, state: TurnState, trail: Trail) -> None:
        """Share the turn's state and its trail."""
        self._state = state
        self._trail = trail

    async def refusal_text(
        self,
        call: ToolCall,
        tool_name: str,
        arguments: dict[str, Any],
        attempt: int,
        hook: HookDecision,
    ) -> str | None:
        """Record the hook's decision; the refusal's text, or ``None`` once a human approved."""
        payload: dict[str, Any] = {"decision": hook.decision, "hook": hook.hook, "text": hook.text}
        text: str | None = hook.text
        if hook.decision == "ask":
            if not self._state.input.config.interactive:
                text = headless_ask_text(hook.text)
                payload["outcome"] = "refused (session not interactive)"
            else:
                answer = await self._await(call, tool_name, arguments, hook.text)
                if answer is None:
                    text = headless_ask_text(hook.text)
                    payload["outcome"] = "refused (no answer in time)"
                elif answer.approved:
                    text = None
                    payload.update(outcome="approved", by=answer.by)
                else:
                    text = answer.reason or f"denied by {answer.by or 'a reviewer'}"
                    payload.update(outcome="denied", by=answer.by, reason=answer.reason)
        self._trail.emit("hook_decision", payload, call_id=call.id, tool=tool_name, attempt=attempt)
        return text

    async def _await(
        self, call: ToolCall, tool_name: str, arguments: dict[str, Any], question: str
    ) -> ApprovalInput | None:
        """Park the call until the ``approval`` Update arrives or the timeout passes."""
        state = self._state
        await self._trail.checkpoint(force=True)  # a human may look at the trail meanwhile
        # A query's answer, not history: adding the times changes no replay.
        asked_at = workflow.now()
        timeout = timedelta(seconds=state.input.config.approval_timeout_s)
        state.waiting[call.id] = PendingApproval(
            tool_call_id=call.id,
            tool_name=tool_name,
            question=question,
            arguments=arguments,
            asked_at=asked_at,
            deadline=asked_at + timeout,
        )
        try:
            await workflow.wait_condition(lambda: call.id in state.answers, timeout=timeout)
        except TimeoutError:
            return None
        finally:
            del state.waiting[call.id]
        return state.answers.pop(call.id)
