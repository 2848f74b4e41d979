"""The workflows' definitions for versioned workers (docs/operations/upgrading.md).

A workflow's versioning behaviour is part of its definition, and an unversioned worker may not
send one (the server refuses the workflow task), so the behaviours that differ from the
versioned worker's default (pinned) live on these subclasses, registered only by workers that
poll as a deployment version (``build_worker`` with a ``deployment_config``).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

from tooltrail.core.wire import AgentRunInput, AgentRunOutput
from tooltrail.workflows.agent import AgentRunWorkflow

__all__ = ["VersionedAgentRunWorkflow"]


# A run follows the current version: its next workflow task after a turn runs there, and
# each new turn (a child, pinned by default) starts and stays there, so a long run never
# holds old workers up. Its own code replays across versions, hence changes to it go behind
# workflow.patched.
@workflow.defn(name="AgentRunWorkflow", versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class VersionedAgentRunWorkflow(AgentRunWorkflow):
    """``AgentRunWorkflow`` as a versioned worker runs it: auto-upgrade."""

    @workflow.init
    def __init__(self, inp: AgentRunInput) -> None:
        """Set up as ``AgentRunWorkflow`` does."""
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: AgentRunInput) -> AgentRunOutput:
        """Run as ``AgentRunWorkflow`` does."""
        return await super().run(inp)
