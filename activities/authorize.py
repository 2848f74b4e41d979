"""The preflight activity: the worker's own access gate answers (see ``workflows.authorize``)."""

from __future__ import annotations

from temporalio import activity

from tooltrail.core.wire import ACCESS_AUTHORIZE, AuthorizeInput, AuthorizeOutcome
from tooltrail.pipeline.dispatcher import ToolDispatcher
from tooltrail.tools import UnknownToolError

__all__ = ["AuthorizeActivities"]


class AuthorizeActivities:
    """Asks the worker's dispatcher, the one its tool activities dispatch with (GIA §6.1)."""

    def __init__(self, dispatcher: ToolDispatcher) -> None:
        """Share the worker's dispatcher (and so its single ``AccessController``)."""
        self.dispatcher = dispatcher

    @activity.defn(name=ACCESS_AUTHORIZE)
    async def authorize(self, inp: AuthorizeInput) -> AuthorizeOutcome:
        """Resolve the name and ask the gate; runs no guardrail or body, writes nothing."""
        try:
            decision = await self.dispatcher.authorize_tool(inp.name, inp.arguments)
        except UnknownToolError:
            return AuthorizeOutcome(allowed=False, unknown=True)
        return AuthorizeOutcome(allowed=decision.allowed, reason=decision.reason)
