"""Large outputs stay out of workflow history (claim check); the model still gets them.

On SQLite and PostgreSQL (``db_url``): the stored copies go through the database.
"""

from __future__ import annotations

import pytest

from tests.conftest import StackFactory
from tooltrail import Host, OutputLimitMiddleware, ToolCall, tool
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

FIVE_MIB = 5 * 1024 * 1024


@tool
def dump(size: int = FIVE_MIB) -> str:
    """Return a very large text."""
    return ("0123456789abcdef" * (size // 16 + 1))[:size]


async def test_a_five_mib_output(stack: StackFactory, db_url: str) -> None:
    async with stack(Host([dump]), database_url=db_url) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("big", "dump", {}),
                ToolCall("big2", "dump", {}),
                ToolCall("small", "dump", {"size": 10}),
            ],
            session_id="large",
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
        events = await tt.audit(turn.turn_id)
        memory = await tt.memory("large")
    big = turn.results[0]
    assert len(big.output) == FIVE_MIB and big.output_ref is None and not big.is_error
    assert turn.results[2].output == "0123456789"
    size = sum(len(e.SerializeToString()) for e in history.events)
    assert size < 200_000, f"history is {size} bytes: the output must not be in it"
    post = next(e for e in events if e.kind == "tool_post" and e.tool_call_id == "big")
    assert len(post.payload["output"]) == FIVE_MIB, "the audit trail has the full output"
    first = next(m for m in memory if m.tool_call_id == "big")
    assert first.content.endswith("\u2026") and len(first.content) < 600


async def test_the_output_limit_cut_still_applies(stack: StackFactory, db_url: str) -> None:
    async with stack(
        Host([dump], middleware=[OutputLimitMiddleware(100)]), database_url=db_url
    ) as tt:
        turn = await tt.run_turn([ToolCall("big", "dump", {})], session_id="large-2")
    assert len(turn.results[0].output) == 100
    assert turn.results[0].output.endswith("\n[truncated]")


async def test_an_agent_reads_a_large_result(stack: StackFactory, db_url: str) -> None:
    model = ScriptedModel(
        [tool_call_response(("c1", "dump", {"size": 400_000})), text_response("read it")]
    )
    async with stack(Host([dump], model=model), database_url=db_url) as tt:
        result = await tt.run_agent("dump it", session_id="large-3")
    assert result.text == "read it"
    tool_message = model.requests[1].messages[-1]
    assert tool_message.role == "tool" and len(tool_message.content) == 400_000


async def test_oversized_arguments_get_a_clear_soft_error(stack: StackFactory, db_url: str) -> None:
    @tool
    def take(blob: str) -> int:
        return len(blob)

    huge = "x" * (700 * 1024)
    async with stack(Host([take]), database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("big", "take", {"blob": huge}), ToolCall("ok", "take", {"blob": "abc"})],
            session_id="large-4",
        )
        events = await tt.audit(turn.turn_id)
    big, ok = turn.results
    assert big.is_error and big.output.startswith("invalid arguments: ")
    assert "at most 524288 are accepted" in big.output
    assert ok.output == "3"
    received = next(e for e in events if e.kind == "tool_call_received" and e.tool_call_id == "big")
    assert received.payload["input_bytes"] > 700 * 1024


async def test_many_large_inputs_flush_in_pieces(stack: StackFactory, db_url: str) -> None:
    @tool
    def take(blob: str) -> int:
        return len(blob)

    calls = [ToolCall(f"c{i}", "take", {"blob": str(i % 10) * 60_000}) for i in range(20)]
    async with stack(Host([take]), database_url=db_url) as tt:
        turn = await tt.run_turn(calls, session_id="large-5")
        events = await tt.audit(turn.turn_id)
    assert [r.output for r in turn.results] == ["60000"] * 20
    assert [e.seq for e in events] == list(range(len(events)))


async def test_a_turn_too_large_to_start_says_so(stack: StackFactory, db_url: str) -> None:
    from tooltrail import ConfigurationError

    @tool
    def take(blob: str) -> int:
        return len(blob)

    calls = [ToolCall(f"c{i}", "take", {"blob": "y" * 500_000}) for i in range(6)]
    async with stack(Host([take]), database_url=db_url) as tt:
        with pytest.raises(ConfigurationError, match="too large to start it"):
            await tt.run_turn(calls, session_id="large-6")


async def test_fifty_megabytes_of_arguments_are_refused_before_any_rpc(
    stack: StackFactory,
) -> None:
    from temporalio.service import RPCError, RPCStatusCode

    from tooltrail import ConfigurationError

    @tool
    def take(blob: str) -> int:
        return len(blob)

    # Past gRPC's 4 MiB message limit the server answers a raw RESOURCE_EXHAUSTED
    # ("received message ... larger than max"); the client must say what is wrong instead.
    calls = [ToolCall("c1", "take", {"blob": "z" * 50_000_000})]
    async with stack(Host([take])) as tt:
        with pytest.raises(ConfigurationError, match=r"too large to start it \(50000\d{3} bytes"):
            await tt.run_turn(calls, session_id="large-7", turn_id="turn-fifty-megabytes")
        with pytest.raises(RPCError) as missing:
            await tt.get_turn("turn-fifty-megabytes").workflow_handle.describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND, "nothing reached the server"
