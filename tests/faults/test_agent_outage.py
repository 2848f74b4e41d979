"""An agent run rides out a database outage that begins during its model call (issue 22, 10).

The model answers while the database is down: the answer cannot be stored, and the model
activity holds it (heartbeating) until the database is back instead of failing, so the run
goes on and the model is never asked twice for one turn.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.conftest import StackFactory
from tests.faults.pg import ThrowawayPostgres
from tooltrail import Host, ToolContext, tool
from tooltrail.core.messages import ModelRequest, ModelResponse
from tooltrail.db.migrate import upgrade
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

DOWN_S = 4.0


@tool
def add(ctx: ToolContext, a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class OutageDuringTheCall(ScriptedModel):
    """Stops the database during its first answer; it comes back ``DOWN_S`` later."""

    def __init__(self, postgres: ThrowawayPostgres) -> None:
        super().__init__([tool_call_response(("c0", "add", {"a": 1, "b": 2})), text_response("3")])
        self.postgres = postgres
        self.calls = 0
        self.restart: asyncio.Task[None] | None = None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            await self.postgres.stop()

            async def back() -> None:
                await asyncio.sleep(DOWN_S)
                await self.postgres.start()

            self.restart = asyncio.create_task(back())
        return await super().complete(request)


@pytest.mark.postgres
async def test_agent_run_rides_out_an_outage_during_the_model_call(
    throwaway_pg: ThrowawayPostgres, stack: StackFactory
) -> None:
    url = throwaway_pg.url
    await upgrade(url)
    model = OutageDuringTheCall(throwaway_pg)
    async with stack(Host([add], model=model), database_url=url) as tt:
        handle = await tt.start_agent("add 1 and 2", session_id=f"agent-{uuid.uuid4()}")
        result = await asyncio.wait_for(handle.result(), timeout=120)
        conversation = await tt.conversation(result.run_id)
    assert model.restart is not None
    await model.restart
    assert result.text == "3"
    # Asked once per model turn: the answer given during the outage was kept, not re-asked.
    assert model.calls == 2
    assert len(conversation) == 4  # prompt, the call, its result, the answer
