"""The reflector activity: host-wired user code that judges a failed attempt.

A reflector may do I/O (ask a model), so it runs here, never in the workflow. A reflector
that raises is reported back as an error, which the workflow turns into a soft ``Fail``: a
broken reflector must never retry a tool or fail a turn.
"""

from __future__ import annotations

import logging

from temporalio import activity

from tooltrail.core.recovery import ReflectionContext, Reflector
from tooltrail.core.wire import RECOVERY_REFLECT, ReflectInput, ReflectOutcome
from tooltrail.tools import ToolRegistry

__all__ = ["RecoveryActivities"]

log = logging.getLogger("tooltrail.recovery")


class RecoveryActivities:
    """Runs the host's reflector."""

    def __init__(self, reflector: Reflector, registry: ToolRegistry) -> None:
        """Wire the reflector and the registry (for parameter schemas)."""
        self.reflector = reflector
        self.registry = registry

    @activity.defn(name=RECOVERY_REFLECT)
    async def reflect(self, inp: ReflectInput) -> ReflectOutcome:
        """Return the reflector's analysis of a failed attempt, or the error it raised."""
        tool = self.registry.lookup(inp.resolved_tool) or self.registry.lookup(inp.tool)
        ctx = ReflectionContext(
            error=inp.error,
            tool=inp.tool,
            arguments=inp.arguments,
            schema=None if tool is None else tool.parameters_schema(),
            attempt=inp.attempt,
            max_attempts=inp.max_attempts,
            task=inp.task,
        )
        try:
            analysis = await self.reflector.analyze(ctx)
        except Exception as exc:
            log.warning("reflector failed for tool %r", inp.tool, exc_info=True)
            return ReflectOutcome(error=f"reflector error ({type(exc).__name__}): {exc}")
        return ReflectOutcome(analysis=analysis)
