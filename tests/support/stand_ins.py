"""Host parts that stall or fail on purpose, shared by the tests and the history recorder."""

from __future__ import annotations

import asyncio

from tooltrail import Analysis, ReflectionContext
from tooltrail.core.messages import ModelRequest, ModelResponse
from tooltrail.llm.scripted import text_response
from tooltrail.tools.scratch import ScratchDirs


class SlowModel:
    """A model that takes a minute to answer."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer, eventually."""
        await asyncio.sleep(60)
        return text_response("late")


class PonderingReflector:
    """A reflector that takes a minute to judge."""

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        """Judge, eventually."""
        await asyncio.sleep(60)
        return Analysis(is_recoverable=True, root_cause=ctx.error)


class BrokenScratch(ScratchDirs):
    """Scratch directories whose removal fails."""

    def remove(self, session_id: str) -> bool:
        """Fail."""
        raise RuntimeError("the disk is on fire")
