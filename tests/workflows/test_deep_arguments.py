"""A model's tool-call arguments nested too deep get one clear answer, and nothing crashes.

Models deliver arguments two ways: as JSON text (OpenAI's Chat Completions) or as a mapping
their SDK parsed (Anthropic's ``input``). Text nested a hundred thousand levels deep was
answered "not valid JSON" (Python's parser gives up at about a thousand levels), and a
mapping deeper than Temporal's payloads or the conversation's JSON column carry failed the
model activity after the model was paid, so the retry asked the model again. Both are now
answered ``invalid arguments: nested deeper than 64 levels``, and the model reads it.

Real Temporal dev server, SQLite, the model clients against a local HTTP server.
"""

from __future__ import annotations

import json

from tests.conftest import StackFactory
from tests.support.llm_server import LLMServer, anthropic_message, openai_completion
from tooltrail import Host, tool
from tooltrail.llm.anthropic import AnthropicMessagesClient
from tooltrail.llm.openai import OpenAIChatClient

TOO_DEEP = "invalid arguments: nested deeper than 64 levels"

runs: list[str] = []


@tool
def echo(text: str) -> str:
    """Return the text."""
    runs.append(text)
    return text


def deep_text(depth: int) -> str:
    """Arguments whose ``x`` nests ``depth`` arrays (valid JSON, 2 bytes a level)."""
    return '{"text": "a", "x": ' + "[" * depth + "]" * depth + "}"


async def test_arguments_text_nested_past_the_parser_is_answered_too_deep(
    stack: StackFactory,
) -> None:
    with LLMServer() as server:
        server.reply(
            body=openai_completion(
                tool_calls=[("c1", "echo", deep_text(100_000)), ("c2", "echo", '{"text": "b"}')]
            )
        )
        server.reply(body=openai_completion("done"))
        client = OpenAIChatClient(server.url, api_key="test-key", model="test-model")
        async with stack(Host([echo], model=client)) as tt:
            result = await tt.run_agent("go", session_id="deep-text")
            conversation = await tt.conversation(result.run_id)
    assert (result.text, len(server.requests)) == ("done", 2)
    answers = [(m.tool_call_id, m.content) for m in conversation if m.role == "tool"]
    assert answers == [("c1", TOO_DEEP), ("c2", "b")]
    # The model is sent its own arguments back, as it wrote them, with the answer.
    sent = server.requests[1].body["messages"]
    [asked] = [m for m in sent if m["role"] == "assistant"]
    assert asked["tool_calls"][0]["function"]["arguments"] == deep_text(100_000)


async def test_arguments_a_provider_parsed_too_deep_are_answered_without_asking_again(
    stack: StackFactory,
) -> None:
    runs.clear()
    # Anthropic's SDK parses ``input`` into a mapping 300 levels deep: more than a payload
    # or a JSON column carries, less than Python's parser gives up at.
    body = json.dumps(
        anthropic_message(
            {"type": "tool_use", "id": "c1", "name": "echo", "input": {"text": "?"}},
            {"type": "tool_use", "id": "c2", "name": "echo", "input": {"text": "b"}},
            stop_reason="tool_use",
        )
    ).replace('{"text": "?"}', deep_text(300))
    with LLMServer() as server:
        server.reply(body=body.encode())
        server.reply(body=anthropic_message({"type": "text", "text": "done"}))
        client = AnthropicMessagesClient(base_url=server.url, api_key="k", model="test-model")
        async with stack(Host([echo], model=client)) as tt:
            result = await tt.run_agent("go", session_id="deep-input")
            conversation = await tt.conversation(result.run_id)
            received = [
                e.payload["input"]
                for e in await tt.audit(result.turns[0])
                if e.kind == "tool_call_received"
            ]
    # The model was asked once for the calls, once after their results: not again.
    assert (result.text, len(server.requests)) == ("done", 2)
    answers = [(m.tool_call_id, m.content) for m in conversation if m.role == "tool"]
    assert answers == [("c1", TOO_DEEP), ("c2", "b")]
    assert runs == ["b"]
    # The trail keeps what the model sent, as JSON text.
    assert json.loads(received[0]) == json.loads(deep_text(300))
