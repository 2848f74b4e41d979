"""Model clients against a real local HTTP server, the retry mapping, and the model activity.

The server answers with bodies built from the official SDKs' own response types, and the
requests the clients send are compared with what the SDKs send for the same conversation,
written by hand in their own parameter types.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message as AnthropicMessage
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import tooltrail.llm
from tests.support.llm_server import (
    Disconnect,
    LLMServer,
    Reply,
    anthropic_message,
    openai_completion,
)
from tooltrail.activities.conversation import ConversationActivities
from tooltrail.activities.tool_execution import Recorder
from tooltrail.core.results import TextPart, ToolCall, ToolDispatchResult
from tooltrail.core.wire import ModelPhase, ModelSettings, ModelTurnRequest
from tooltrail.db.store import AuditStore
from tooltrail.errors import ConfigurationError
from tooltrail.llm import (
    MODEL_RETRY_POLICY,
    AnthropicMessagesClient,
    Message,
    ModelConnectionError,
    ModelHTTPError,
    ModelRequest,
    ModelRequestError,
    ModelResponse,
    ModelResponseError,
    OpenAIChatClient,
    ScriptedModel,
    ScriptExhaustedError,
    Thinking,
    Usage,
    build_model_client,
    classify,
    parse_retry_after,
    text_response,
    to_application_error,
    tool_call_response,
)
from tooltrail.settings import Settings
from tooltrail.tools import ToolRegistry, tool


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "2 + 2".
    """
    return expression


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as srv:
        yield srv


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry([calculate])


def conversation() -> list[Message]:
    return [
        Message.system("You are terse."),
        Message.user("What is 2+2 and 3+3?"),
        Message.assistant(
            "Let me compute.",
            [
                ToolCall("c1", "calculate", {"expression": "2+2"}),
                ToolCall("c2", "calculate", '{"expression": "3+3"}'),
            ],
        ),
        Message.tool("c1", "4", name="calculate"),
        Message.tool("c2", "boom", name="calculate", is_error=True),
    ]


def make_client(
    provider: str, server: LLMServer, **options: Any
) -> OpenAIChatClient | AnthropicMessagesClient:
    if provider == "openai":
        return OpenAIChatClient(server.url, api_key="k", model="m", **options)
    return AnthropicMessagesClient(base_url=server.url, api_key="k", model="c", **options)


async def expect_error(client: OpenAIChatClient | AnthropicMessagesClient) -> BaseException:
    errors = (ModelHTTPError, ModelConnectionError, ModelResponseError, ModelRequestError)
    with pytest.raises(errors) as info:
        await client.complete(ModelRequest(messages=[Message.user("hi")]))
    return info.value


# -- OpenAI-compatible ----------------------------------------------------------------------


def without_nulls(value: Any) -> Any:
    """A JSON value without its null-valued keys (the SDKs' own params spell them out)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def sdk_headers(sent: Any) -> dict[str, str]:
    """The headers a request carried, without the ones that vary per connection."""
    return {k: v for k, v in sent.headers.items() if k not in ("host", "content-length")}


async def test_openai_request_matches_what_the_sdk_sends(
    server: LLMServer, registry: ToolRegistry
) -> None:
    messages = [
        *conversation(),
        Message.tool("c3", "", name="calculate", is_error=True),  # ToolError("")
        Message.assistant("  "),  # a blank answer from a caller-built history: not sent
        Message.assistant(refusal="I can't help with that."),
        Message.user("thanks"),
    ]
    server.reply(200, openai_completion("ok"))
    server.reply(200, openai_completion("ok"))
    async with OpenAIChatClient(
        f"{server.url}/v1/",
        api_key="sk-test",
        model="m-default",
        organization="org-1",
        project="proj-1",
        headers={"x-gateway": "g1"},
    ) as client:
        await client.complete(
            ModelRequest(
                messages=messages,
                tools=registry.openai_tools(),
                model="gpt-4.1",
                temperature=0.2,
                max_tokens=50,
            )
        )
    # The same conversation, written by hand in the SDK's own types.
    sdk = openai.AsyncOpenAI(
        base_url=f"{server.url}/v1/",
        api_key="sk-test",
        organization="org-1",
        project="proj-1",
        default_headers={"x-gateway": "g1"},
        max_retries=0,
    )
    async with sdk:
        await sdk.chat.completions.create(
            model="gpt-4.1",
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2 and 3+3?"},
                {
                    "role": "assistant",
                    "content": "Let me compute.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "calculate", "arguments": '{"expression": "2+2"}'},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            # Raw text goes back exactly as the model wrote it.
                            "function": {"name": "calculate", "arguments": '{"expression": "3+3"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
                {"role": "tool", "tool_call_id": "c2", "content": "boom"},
                {
                    "role": "tool",
                    "tool_call_id": "c3",
                    "content": "tool 'calculate' failed without a message",
                },
                {"role": "assistant", "content": None, "refusal": "I can't help with that."},
                {"role": "user", "content": "thanks"},
            ],
            tools=registry.openai_tools(),  # type: ignore[arg-type]
            temperature=0.2,
            max_completion_tokens=50,
        )
    ours, theirs = server.requests
    assert ours.path == theirs.path == "/v1/chat/completions"
    assert ours.body == theirs.body
    assert "max_tokens" not in ours.body and ours.body["max_completion_tokens"] == 50
    assert sdk_headers(ours) == sdk_headers(theirs)
    assert ours.headers["authorization"] == "Bearer sk-test"
    assert (ours.headers["openai-organization"], ours.headers["openai-project"]) == (
        "org-1",
        "proj-1",
    )
    assert ours.headers["x-gateway"] == "g1"
    # The SDK's timeout (10 minutes), not the hand-written client's 120 s.
    assert ours.headers["x-stainless-read-timeout"] == "600"


@pytest.mark.parametrize(
    ("model", "sent"),
    [
        ("gpt-4.1", True),
        ("gpt-4o-mini", True),
        ("llama3.1:8b", True),
        ("o3", False),
        ("o4-mini", False),
        ("gpt-5.2", False),
        ("openai/gpt-5-mini", False),
        ("codex-mini-latest", False),
    ],
)
async def test_openai_temperature_only_for_families_that_take_it(
    server: LLMServer, caplog: pytest.LogCaptureFixture, model: str, sent: bool
) -> None:
    server.reply(200, openai_completion("ok"))
    server.reply(200, openai_completion("ok"))
    request = ModelRequest(messages=[Message.user("hi")], model=model, temperature=0.5)
    with caplog.at_level(logging.WARNING, logger="tooltrail.model"):
        async with OpenAIChatClient(server.url, api_key="k", model="m") as client:
            for _ in range(2):
                await client.complete(request)
    assert all(("temperature" in r.body) is sent for r in server.requests)
    warnings = [r for r in caplog.records if "temperature is not sent" in r.getMessage()]
    assert len(warnings) == (0 if sent else 1)  # once per model, not per request


async def test_openai_max_tokens_field_for_older_servers(
    server: LLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.reply(200, openai_completion("ok"))
    with caplog.at_level(logging.WARNING, logger="tooltrail.model"):
        async with OpenAIChatClient(
            server.url, model="m", max_tokens_field="max_tokens", timeout_s=30
        ) as client:
            await client.complete(
                ModelRequest(
                    messages=[Message.user("hi")], max_tokens=9, thinking=2048, prompt_caching=True
                )
            )
    [sent] = server.requests
    assert sent.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 9,  # and nothing of Anthropic's settings
    }
    assert "thinking is not sent to model 'm'" in caplog.text
    assert sent.headers["x-stainless-read-timeout"] == "30"


async def test_openai_defaults_and_anthropic_catalog(
    server: LLMServer, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No key: no Authorization header, whatever the SDK's own variable says.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-sdks-env")
    server.reply(200, openai_completion("ok"))
    async with OpenAIChatClient(server.url, model="m-default") as client:
        await client.complete(
            ModelRequest(
                messages=[Message.assistant(tool_calls=[ToolCall("c1", "calculate", {})])],
                tools=registry.anthropic_tools(),
            )
        )
    [sent] = server.requests
    assert "authorization" not in sent.headers
    assert sent.body["model"] == "m-default"
    assert "temperature" not in sent.body
    assert "max_tokens" not in sent.body and "max_completion_tokens" not in sent.body
    assert sent.body["messages"][0]["content"] is None
    assert sent.body["tools"] == registry.openai_tools()


async def test_openai_response_keeps_raw_arguments(server: LLMServer) -> None:
    server.reply(
        200,
        openai_completion(
            None,
            [("call_a", "calculate", '{"expression": "2+2"}'), ("call_b", "calculate", '{"expr')],
            prompt_tokens=120,
            completion_tokens=30,
            id="chatcmpl-xyz",
        ),
    )
    async with OpenAIChatClient(server.url, model="m") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("hi")]))
    assert response == ModelResponse(
        message=Message.assistant(
            "",
            [
                ToolCall("call_a", "calculate", '{"expression": "2+2"}'),
                ToolCall("call_b", "calculate", '{"expr'),
            ],
        ),
        usage=Usage(input_tokens=120, output_tokens=30),
        stop_reason="tool_use",
        raw_id="chatcmpl-xyz",
    )
    assert isinstance(response.message.tool_calls[1].arguments, str)


async def test_openai_text_response(server: LLMServer) -> None:
    server.reply(200, openai_completion("4", finish_reason="length"))
    async with OpenAIChatClient(server.url, model="m") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("2+2?")]))
    assert response.message == Message.assistant("4")
    assert response.stop_reason == "max_tokens"
    assert response.usage.total_tokens == 18


async def test_openai_refusal_is_read_as_one(server: LLMServer) -> None:
    server.reply(200, openai_completion(None, refusal="I can't help with that."))
    server.reply(200, openai_completion(None, finish_reason="content_filter"))
    async with OpenAIChatClient(server.url, model="m") as client:
        refused = await client.complete(ModelRequest(messages=[Message.user("bad")]))
        filtered = await client.complete(ModelRequest(messages=[Message.user("bad")]))
    assert refused.stop_reason == "refusal"
    assert refused.message == Message.assistant("", refusal="I can't help with that.")
    assert filtered.stop_reason == "content_filter"


async def test_openai_counts_cached_tokens(server: LLMServer) -> None:
    server.reply(
        200,
        openai_completion(
            "ok",
            prompt_tokens=2000,
            completion_tokens=10,
            cached_tokens=1536,
            cache_write_tokens=64,
        ),
    )
    async with OpenAIChatClient(server.url, model="m") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("hi")]))
    assert response.usage == Usage(
        input_tokens=2000, output_tokens=10, cache_read_tokens=1536, cache_write_tokens=64
    )


async def test_openai_compatible_answers_still_parse(server: LLMServer) -> None:
    # Compatible servers leave out ids, types and finish reasons, or answer content parts.
    server.reply(
        200,
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                        "tool_calls": [{"function": {"name": "calculate", "arguments": "{}"}}],
                    }
                }
            ]
        },
    )
    async with OpenAIChatClient(server.url, model="m") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("hi")]))
    assert response.message == Message.assistant("ab", [ToolCall("call_0", "calculate", "{}")])
    assert (response.stop_reason, response.usage, response.raw_id) == ("tool_use", Usage(), None)


async def test_a_given_sdk_client_runs_without_its_retries(server: LLMServer) -> None:
    server.reply(503, {"error": {"message": "busy"}})
    sdk = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=5)
    async with sdk:
        client = OpenAIChatClient(model="m", sdk_client=sdk)
        error = await expect_error(client)
        await client.aclose()  # borrowed: left open for its owner
        assert not sdk.is_closed()
    assert isinstance(error, ModelHTTPError) and error.status == 503
    assert len(server.requests) == 1


# -- Anthropic ------------------------------------------------------------------------------


def api_block(block: Thinking) -> dict[str, Any]:
    """A thinking block as the Messages API answers it."""
    if block.type == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}


THINKING = Thinking(thinking="2+2 is 4; 3+3 is 6.", signature="c2lnbmF0dXJl")
REDACTED = Thinking(type="redacted_thinking", data="ZW5jcnlwdGVk")


async def test_anthropic_request_matches_what_the_sdk_sends(
    server: LLMServer, registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    system, user, assistant, *results = conversation()
    messages = [
        system,
        user,
        assistant.model_copy(update={"thinking": [THINKING, REDACTED]}),
        *results,
        Message.tool("c3", " ", name="calculate", is_error=True),  # ToolError(" ")
        Message.assistant("  "),  # a blank answer from a caller-built history: not sent
        Message.user("thanks"),
    ]
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    with caplog.at_level(logging.WARNING, logger="tooltrail.model"):
        async with AnthropicMessagesClient(
            base_url=server.url,
            api_key="ak-test",
            model="claude-test",
            headers={"anthropic-beta": "some-beta-2026-01-01"},
        ) as client:
            await client.complete(
                ModelRequest(
                    messages=messages,
                    tools=registry.anthropic_tools(),
                    temperature=0.3,  # set for another provider: dropped, the run goes on
                    thinking=2048,
                    prompt_caching=True,
                )
            )
    # The same conversation, written by hand in the SDK's own types.
    cached_tools: list[Any] = registry.anthropic_tools()
    cached_tools[-1] = {**cached_tools[-1], "cache_control": {"type": "ephemeral"}}
    sdk = anthropic.AsyncAnthropic(
        base_url=server.url,
        api_key="ak-test",
        default_headers={"anthropic-beta": "some-beta-2026-01-01"},
        max_retries=0,
    )
    async with sdk:
        await sdk.messages.create(
            model="claude-test",
            max_tokens=8192 + 2048,
            system=[
                {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "What is 2+2 and 3+3?"}]},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "thinking",
                            "thinking": "2+2 is 4; 3+3 is 6.",
                            "signature": "c2lnbmF0dXJl",
                        },
                        {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
                        {"type": "text", "text": "Let me compute."},
                        {
                            "type": "tool_use",
                            "id": "c1",
                            "name": "calculate",
                            "input": {"expression": "2+2"},
                        },
                        {
                            "type": "tool_use",
                            "id": "c2",
                            "name": "calculate",
                            "input": {"expression": "3+3"},
                        },
                    ],
                },
                {
                    # Every result of the assistant turn, in one user message.
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "c1", "content": "4"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "c2",
                            "content": "boom",
                            "is_error": True,
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "c3",
                            "content": "tool 'calculate' failed without a message",
                            "is_error": True,
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
            tools=cached_tools,
            thinking={"type": "enabled", "budget_tokens": 2048},
        )
    ours, theirs = server.requests
    assert ours.path == theirs.path == "/v1/messages"
    assert ours.body == theirs.body
    assert "temperature" not in ours.body
    assert sdk_headers(ours) == sdk_headers(theirs)
    assert ours.headers["authorization"] == "Bearer ak-test"
    assert ours.headers["anthropic-beta"] == "some-beta-2026-01-01"
    assert ours.headers["x-stainless-read-timeout"] == "600"
    assert "temperature is not sent" in caplog.text


async def test_anthropic_defaults(
    server: LLMServer, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-the-sdks-env")
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    async with AnthropicMessagesClient(
        base_url=server.url, api_key=None, model="c", anthropic_version="2023-06-01"
    ) as client:
        await client.complete(
            ModelRequest(messages=[Message.user("hi")], tools=registry.openai_tools())
        )
        await client.complete(ModelRequest(messages=[Message.user("hi")], thinking="adaptive"))
    first, second = server.requests
    assert first.body["tools"] == registry.anthropic_tools()  # no cache_control by default
    assert first.body["max_tokens"] == 8192
    assert not {"system", "thinking", "temperature"} & set(first.body)
    assert "authorization" not in first.headers and "x-api-key" not in first.headers
    assert first.headers["anthropic-version"] == "2023-06-01"
    assert (second.body["thinking"], second.body["max_tokens"]) == ({"type": "adaptive"}, 8192)


async def test_anthropic_response_mapping(server: LLMServer) -> None:
    server.reply(
        200,
        anthropic_message(
            api_block(THINKING),
            api_block(REDACTED),
            {"type": "text", "text": "Computing."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "calculate",
                "input": {"expression": "2+2"},
            },
            stop_reason="tool_use",
            input_tokens=40,
            output_tokens=9,
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=200,
            id="msg_abc",
        ),
    )
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("2+2?")]))
    assert response == ModelResponse(
        message=Message.assistant(
            "Computing.",
            [ToolCall("toolu_1", "calculate", {"expression": "2+2"})],
            thinking=[THINKING, REDACTED],
        ),
        # Every prompt token, cached ones included; the cache's share on its own.
        usage=Usage(
            input_tokens=1240, output_tokens=9, cache_read_tokens=1000, cache_write_tokens=200
        ),
        stop_reason="tool_use",
        raw_id="msg_abc",
    )


async def test_anthropic_thinking_goes_back_as_the_sdk_would_send_it(server: LLMServer) -> None:
    # The answer's blocks, sent back with the tool result: the SDK's own round trip is
    # Message.to_param(), which spells out its null fields.
    answer = anthropic_message(
        api_block(THINKING),
        api_block(REDACTED),
        {"type": "text", "text": "Computing."},
        {"type": "tool_use", "id": "toolu_1", "name": "calculate", "input": {"expression": "1"}},
        stop_reason="tool_use",
    )
    server.reply(200, answer)
    server.reply(200, anthropic_message({"type": "text", "text": "1"}))
    server.reply(200, anthropic_message({"type": "text", "text": "1"}))
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        first = await client.complete(ModelRequest(messages=[Message.user("1?")], thinking=1024))
        history = [Message.user("1?"), first.message, Message.tool("toolu_1", "1")]
        await client.complete(ModelRequest(messages=history, thinking=1024))
    sdk = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
    async with sdk:
        await sdk.messages.create(
            model="c",
            max_tokens=8192 + 1024,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "1?"}]},
                AnthropicMessage.model_validate(answer).to_param(),
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}],
                },
            ],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    _, ours, theirs = server.requests
    assert ours.body == without_nulls(theirs.body)
    assert ours.body["messages"][1]["content"][:2] == theirs.body["messages"][1]["content"][:2]


async def test_anthropic_refusal_is_read_as_one(server: LLMServer) -> None:
    server.reply(
        200,
        anthropic_message(
            stop_reason="refusal",
            stop_details={
                "type": "refusal",
                "category": "cyber",
                "explanation": "This looks like malware development.",
            },
        ),
    )
    server.reply(200, anthropic_message(stop_reason="refusal"))
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        explained = await client.complete(ModelRequest(messages=[Message.user("bad")]))
        bare = await client.complete(ModelRequest(messages=[Message.user("bad")]))
    assert explained.stop_reason == bare.stop_reason == "refusal"
    assert explained.message == Message.assistant(
        "", refusal="This looks like malware development."
    )
    assert bare.message.refusal == "the model declined to answer"


@pytest.mark.parametrize("stop_reason", ["pause_turn", "model_context_window_exceeded"])
async def test_anthropic_stop_reasons_pass_through(server: LLMServer, stop_reason: str) -> None:
    server.reply(
        200, anthropic_message({"type": "text", "text": "so far"}, stop_reason=stop_reason)
    )
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("go")]))
    assert response.stop_reason == stop_reason


async def test_a_request_the_sdk_refuses_is_final(server: LLMServer) -> None:
    # The SDK will not send a max_tokens it expects to take over 10 minutes unstreamed.
    async with AnthropicMessagesClient(
        base_url=server.url, api_key="k", model="c", max_tokens=100_000
    ) as client:
        error = await expect_error(client)
    assert isinstance(error, ModelRequestError)
    assert "Streaming is required" in str(error)
    app = to_application_error(error)
    assert (app.type, app.non_retryable) == ("ModelRequestRejected", True)
    assert server.requests == []


# -- HTTP errors and the retry mapping ------------------------------------------------------


async def test_429_with_retry_after_is_retryable_with_delay(server: LLMServer) -> None:
    server.reply(
        429,
        {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
        retry_after="2",
        x_request_id="req-42",
    )
    async with OpenAIChatClient(server.url, model="m") as client:
        error = await expect_error(client)
    assert isinstance(error, ModelHTTPError)
    assert (error.status, error.retry_after_s, error.retryable) == (429, 2.0, True)
    assert error.request_id == "req-42"
    assert "Rate limit reached" in str(error)
    app = to_application_error(error)
    assert app.type == "ModelUnavailable"
    assert not app.non_retryable
    assert app.next_retry_delay == timedelta(seconds=2)
    assert app.details == ({"status": 429, "request_id": "req-42"},)
    assert len(server.requests) == 1  # the client itself never retries


async def test_anthropic_529_with_retry_after_is_retryable_with_delay(server: LLMServer) -> None:
    server.reply(
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        retry_after="3",
        request_id="req-9",
    )
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        error = await expect_error(client)
    assert isinstance(error, ModelHTTPError)
    assert (error.status, error.retry_after_s, error.request_id) == (529, 3.0, "req-9")
    assert error.message == "Overloaded (overloaded_error)"
    app = to_application_error(error)
    assert (app.type, app.non_retryable, app.next_retry_delay) == (
        "ModelUnavailable",
        False,
        timedelta(seconds=3),
    )
    assert len(server.requests) == 1


async def test_400_is_final(server: LLMServer) -> None:
    server.reply(
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": "bad tool"}},
        request_id="req-7",
    )
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        error = await expect_error(client)
    assert isinstance(error, ModelHTTPError)
    assert error.message == "bad tool (invalid_request_error)"
    assert error.request_id == "req-7"
    app = to_application_error(error)
    assert app.type == "ModelRequestRejected"
    assert app.non_retryable
    assert app.next_retry_delay is None


@pytest.mark.parametrize("status", [503, 529])
async def test_5xx_is_retryable_without_delay(server: LLMServer, status: int) -> None:
    server.reply(status, b"<html>upstream down</html>")
    async with OpenAIChatClient(server.url, model="m") as client:
        error = await expect_error(client)
    assert isinstance(error, ModelHTTPError)
    assert error.message == "<html>upstream down</html>"
    app = to_application_error(error)
    assert (app.type, app.non_retryable, app.next_retry_delay) == ("ModelUnavailable", False, None)
    assert len(server.requests) == 1


async def test_server_may_override_verdict(server: LLMServer) -> None:
    server.reply(400, {"error": {"message": "try again"}}, x_should_retry="true")
    server.reply(500, {"error": {"message": "do not"}}, x_should_retry="false")
    async with OpenAIChatClient(server.url, model="m") as client:
        first = await expect_error(client)
        second = await expect_error(client)
    assert not to_application_error(first).non_retryable
    assert to_application_error(second).non_retryable


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_dropped_connection_is_retryable(server: LLMServer, provider: str) -> None:
    server.enqueue(Disconnect())
    async with make_client(provider, server) as client:
        error = await expect_error(client)
    assert isinstance(error, ModelConnectionError)
    sdk: Any = openai if provider == "openai" else anthropic
    assert isinstance(error.__cause__, sdk.APIConnectionError)
    app = to_application_error(error)
    assert (app.type, app.non_retryable) == ("ModelUnavailable", False)
    assert len(server.requests) == 1  # the SDK's own retries are off


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_timeout_is_retryable(server: LLMServer, provider: str) -> None:
    slow = Reply(200, openai_completion("late"), delay_s=2.0)
    server.enqueue(slow)
    async with make_client(provider, server, timeout_s=0.5) as client:
        error = await expect_error(client)
    assert isinstance(error, ModelConnectionError)
    sdk: Any = openai if provider == "openai" else anthropic
    assert isinstance(error.__cause__, sdk.APITimeoutError)
    assert not to_application_error(error).non_retryable
    assert len(server.requests) == 1


async def test_refused_connection_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIChatClient(f"http://127.0.0.1:{port}", model="m", timeout_s=5) as client:
        error = await expect_error(client)
    assert isinstance(error, ModelConnectionError)
    assert not to_application_error(error).non_retryable


def test_raw_transport_error_is_retryable() -> None:
    import httpx2

    for error in (httpx.ReadTimeout("read timed out"), httpx2.ReadTimeout("read timed out")):
        app = to_application_error(error)
        assert (app.type, app.non_retryable) == ("ModelUnavailable", False)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_non_json_success_is_final(server: LLMServer, provider: str) -> None:
    server.reply(200, b"<html>login page</html>")
    server.reply(200, {"unexpected": True})
    async with make_client(provider, server) as client:
        for _ in range(2):
            error = await expect_error(client)
            assert isinstance(error, ModelResponseError)
            app = to_application_error(error)
            assert (app.type, app.non_retryable) == ("ModelResponseInvalid", True)


def test_long_retry_after_is_capped() -> None:
    app = to_application_error(ModelHTTPError(429, "slow down", 7200.0))
    assert app.next_retry_delay == timedelta(seconds=tooltrail.llm.MAX_RETRY_AFTER_S)


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        *[(status, True) for status in (408, 409, 429, 500, 503, 529)],
        *[(status, False) for status in (400, 401, 403, 404, 413, 422)],
    ],
)
def test_classify(status: int, retryable: bool) -> None:
    assert classify(status) is retryable


def test_retry_after_ms_wins_over_seconds() -> None:
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"Retry-After-Ms": "250", "Retry-After": "9"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "junk", "retry-after": "3"}) == 3.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "0.5"})) == 0.5


def test_retry_after_http_date() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=45), usegmt=True)
    assert later == "Wed, 01 Jan 2025 12:00:45 GMT"
    assert parse_retry_after({"Retry-After": later}, now=now) == 45.0
    earlier = format_datetime(now - timedelta(seconds=5), usegmt=True)
    assert parse_retry_after({"Retry-After": earlier}, now=now) == 0.0


@pytest.mark.parametrize(
    "headers", [{}, {"retry-after": ""}, {"retry-after": "soon"}, {"retry-after": "nan"}]
)
def test_retry_after_absent_or_invalid(headers: dict[str, str]) -> None:
    assert parse_retry_after(headers) is None


def test_negative_retry_after_is_zero() -> None:
    assert parse_retry_after({"retry-after": "-3"}) == 0.0


def test_retry_policy_is_bounded() -> None:
    assert MODEL_RETRY_POLICY.initial_interval == timedelta(seconds=1)
    assert MODEL_RETRY_POLICY.backoff_coefficient == 2.0
    assert MODEL_RETRY_POLICY.maximum_interval == timedelta(seconds=30)
    assert MODEL_RETRY_POLICY.maximum_attempts == 6
    assert "ModelRequestRejected" in (MODEL_RETRY_POLICY.non_retryable_error_types or [])


# -- the scripted model ---------------------------------------------------------------------


async def test_scripted_model_answers_in_order_then_refuses() -> None:
    def echo_results(request: ModelRequest) -> ModelResponse:
        return text_response(f"got {request.messages[-1].content}")

    model = ScriptedModel(
        [
            tool_call_response(("c1", "calculate", {"expression": "2+2"}), text="computing"),
            echo_results,
        ]
    )
    first = await model.complete(ModelRequest(messages=[Message.user("2+2?")]))
    assert first.stop_reason == "tool_use"
    assert first.message == Message.assistant(
        "computing", [ToolCall("c1", "calculate", {"expression": "2+2"})]
    )
    second = await model.complete(
        ModelRequest(messages=[Message.user("2+2?"), first.message, Message.tool("c1", "4")])
    )
    assert second.message == Message.assistant("got 4")
    assert second.stop_reason == "end_turn"
    assert model.remaining == 0
    assert [len(r.messages) for r in model.requests] == [1, 3]
    with pytest.raises(ScriptExhaustedError, match=r"no response for request #3"):
        await model.complete(ModelRequest(messages=[Message.user("more?")]))
    app = to_application_error(ScriptExhaustedError("x"))
    assert (app.type, app.non_retryable) == ("ModelScriptExhausted", True)


async def test_scripted_responses_are_copies() -> None:
    response = text_response("hi")
    model = ScriptedModel([response])
    got = await model.complete(ModelRequest(messages=[]))
    got.message.content = "changed"
    assert response.message.content == "hi"


# -- messages -------------------------------------------------------------------------------


def test_message_roles_are_checked() -> None:
    with pytest.raises(ValueError, match="tool_call_id"):
        Message(role="tool", content="4")
    with pytest.raises(ValueError, match="only assistant"):
        Message(role="user", content="x", tool_calls=[ToolCall("c1", "calculate")])


def test_thinking_and_refusals_belong_to_assistant_messages() -> None:
    with pytest.raises(ValueError, match="only assistant messages carry thinking"):
        Message(role="user", content="x", thinking=[THINKING])
    with pytest.raises(ValueError, match="only assistant messages carry a refusal"):
        Message(role="tool", tool_call_id="c1", refusal="no")


def test_new_fields_travel_only_when_set() -> None:
    # Every turn's history holds messages and usages: without thinking, a refusal or cached
    # tokens they serialize exactly as before those fields existed.
    assert Message.assistant("hi").model_dump() == {
        "role": "assistant",
        "content": "hi",
        "tool_calls": [],
        "tool_call_id": None,
        "name": None,
        "is_error": False,
        "content_ref": None,
    }
    assert Usage(input_tokens=1).model_dump() == {"input_tokens": 1, "output_tokens": 0}
    full = ModelResponse(
        message=Message.assistant("", thinking=[THINKING, REDACTED], refusal="no"),
        usage=Usage(input_tokens=9, cache_read_tokens=5, cache_write_tokens=2),
        stop_reason="refusal",
    )
    assert ModelResponse.model_validate_json(full.model_dump_json()) == full
    assert Usage(input_tokens=1, cache_read_tokens=1) + Usage(
        output_tokens=2, cache_write_tokens=3
    ) == Usage(input_tokens=1, output_tokens=2, cache_read_tokens=1, cache_write_tokens=3)


def test_a_thinking_budget_is_a_real_number() -> None:
    assert ModelSettings(thinking=4096).thinking == 4096
    assert ModelSettings.model_validate_json('{"thinking": "adaptive"}').thinking == "adaptive"
    for wrong in (True, "4096", "on"):
        with pytest.raises(ValueError, match="thinking"):
            ModelSettings(thinking=wrong)  # type: ignore[arg-type]


def test_message_from_dispatch_result() -> None:
    result = ToolDispatchResult(
        tool_call_id="c1",
        output=[TextPart("a"), TextPart("b")],
        is_error=True,
        duration_ms=1.0,
        resolved_tool_name="calculate",
    )
    assert Message.from_result(result) == Message.tool(
        "c1", "a\nb", name="calculate", is_error=True
    )


def test_request_round_trips_through_json() -> None:
    request = ModelRequest(messages=conversation(), tools=[{"name": "x"}], max_tokens=5)
    assert ModelRequest.model_validate_json(request.model_dump_json()) == request


# -- settings -------------------------------------------------------------------------------


async def test_client_from_settings(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLTRAIL_ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("TOOLTRAIL_ANTHROPIC_API_KEY", "from-env")
    monkeypatch.setenv("TOOLTRAIL_OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("TOOLTRAIL_OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("TOOLTRAIL_MODEL", "env-model")
    settings = Settings(_env_file=None)
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    server.reply(200, openai_completion("ok"))
    async with build_model_client("anthropic", settings) as anthropic:
        assert isinstance(anthropic, AnthropicMessagesClient)
        await anthropic.complete(ModelRequest(messages=[Message.user("hi")]))
    async with build_model_client("openai", settings, model="override") as openai:
        assert isinstance(openai, OpenAIChatClient)
        await openai.complete(ModelRequest(messages=[Message.user("hi")]))
    first, second = server.requests
    assert (first.path, first.headers["authorization"], first.body["model"]) == (
        "/v1/messages",
        "Bearer from-env",
        "env-model",
    )
    assert (second.path, second.headers["authorization"], second.body["model"]) == (
        "/v1/chat/completions",
        "Bearer sk-env",
        "override",
    )


def test_client_needs_a_model_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLTRAIL_MODEL", raising=False)
    with pytest.raises(ConfigurationError, match="TOOLTRAIL_MODEL"):
        build_model_client("openai", Settings(_env_file=None))


def test_package_root_loads_no_sdk_and_no_http_client() -> None:
    # Workflow code imports tooltrail.llm for the models and the retry policy.
    code = (
        "import sys, tooltrail.llm\n"
        "loaded = {'httpx', 'httpx2', 'openai', 'anthropic'} & set(sys.modules)\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("missing", "name", "present"),
    [
        ("openai", "OpenAIChatClient", "anthropic"),
        ("anthropic", "AnthropicMessagesClient", "openai"),
    ],
)
def test_a_missing_sdk_names_its_extra(missing: str, name: str, present: str) -> None:
    # The SDK is made unimportable (as when it is not installed); the other provider's
    # client, and the factory for it, still work.
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "import tooltrail.llm as llm\n"
        "from tooltrail.settings import Settings\n"
        "try:\n"
        f"    getattr(llm, {name!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        f"client = llm.build_model_client({present!r}, Settings(_env_file=None), model='m')\n"
        "print(type(client).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    message, other = done.stdout.strip().splitlines()
    assert message == (
        f"{name} runs on the {missing!r} package, which is not installed: "
        f"install it with `pip install 'tooltrail[{missing}]'`"
    )
    assert other != name


def test_public_surface() -> None:
    for name in tooltrail.llm.__all__:
        assert getattr(tooltrail.llm, name) is not None
    with pytest.raises(AttributeError):
        _ = tooltrail.llm.NoSuchThing


# -- the model activity, in a real activity environment -----------------------------------


def model_turn_request(run_id: str, prompt: str, **settings: Any) -> ModelTurnRequest:
    return ModelTurnRequest(
        phase=ModelPhase(
            run_id=run_id,
            start_seq=0,
            new_messages=[Message.user(prompt)],
            settings=ModelSettings(**settings),
        ),
        turn_id=f"{run_id}-turn-0",
    )


async def test_activity_maps_429_to_retryable_error_with_delay(
    server: LLMServer, sqlite_url: str
) -> None:
    server.reply(429, {"error": {"message": "Rate limit"}}, retry_after_ms="1500")
    server.reply(200, openai_completion("4"))
    env = ActivityEnvironment()
    store = AuditStore(sqlite_url)
    try:
        async with OpenAIChatClient(server.url, model="m") as client:
            activities = ConversationActivities(client, Recorder(store))
            request = model_turn_request("run-429", "2+2?")
            with pytest.raises(ApplicationError) as info:
                await env.run(activities.model_turn, request)
            assert info.value.type == "ModelUnavailable"
            assert not info.value.non_retryable
            assert info.value.next_retry_delay == timedelta(milliseconds=1500)
            assert isinstance(info.value.__cause__, ModelHTTPError)
            outcome = await env.run(activities.model_turn, request)
    finally:
        await store.close()
    assert outcome.response.message.content == "4"
    assert len(server.requests) == 2


async def test_the_activity_keeps_thinking_in_sql_and_out_of_the_outcome(
    server: LLMServer, db_url: str
) -> None:
    # Bad input for the store: long, signed, opaque blocks in the conversation's JSON, on
    # SQLite and PostgreSQL, with no migration.
    thinking = [THINKING.model_copy(update={"thinking": "é∑ " * 4000}), REDACTED]
    server.reply(
        200,
        anthropic_message(
            *[api_block(block) for block in thinking],
            {"type": "tool_use", "id": "toolu_1", "name": "calculate", "input": {}},
            stop_reason="tool_use",
            cache_read_input_tokens=100,
        ),
    )
    env = ActivityEnvironment()
    store = AuditStore(db_url)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    try:
        async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
            activities = ConversationActivities(client, Recorder(store))
            request = model_turn_request(run_id, "think", thinking=1024, prompt_caching=True)
            outcome = await env.run(activities.model_turn, request)
            again = await env.run(activities.model_turn, request)  # a retried activity
        stored = await store.conversation(run_id)
    finally:
        await store.close()
    assert len(server.requests) == 1
    assert server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert again.reused  # the stored answer (its raw_id is not stored)
    assert again.response == outcome.response.model_copy(update={"raw_id": None})
    assert outcome.response.message.thinking == []  # not in the workflow's history
    assert outcome.response.message.tool_calls == [ToolCall("toolu_1", "calculate", {})]
    assert outcome.response.usage.cache_read_tokens == 100
    assert stored[-1].thinking == thinking  # but in the conversation, verbatim
    assert stored[-1].tool_calls == outcome.response.message.tool_calls


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            anthropic_message(
                {"type": "text", "text": "Let me"},
                {"type": "tool_use", "id": "t1", "name": "calculate", "input": {"expr": "1"}},
                stop_reason="max_tokens",
            ),
            r"cut off by max_tokens=64 in the middle of its tool calls \(calculate\)",
        ),
        (
            anthropic_message(api_block(THINKING), stop_reason="max_tokens"),
            r"cut off by max_tokens=64 before it said anything",
        ),
        (
            anthropic_message(stop_reason="model_context_window_exceeded"),
            r"cut off by the context window before it said anything: the conversation has "
            r"outgrown the model's context window$",
        ),
    ],
)
async def test_the_activity_refuses_a_truncated_answer(
    server: LLMServer, sqlite_url: str, answer: dict[str, Any], expected: str
) -> None:
    server.reply(200, answer)
    env = ActivityEnvironment()
    store = AuditStore(sqlite_url)
    try:
        async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
            activities = ConversationActivities(client, Recorder(store))
            with pytest.raises(ApplicationError, match=expected) as info:
                await env.run(
                    activities.model_turn, model_turn_request("run-cut", "go", max_tokens=64)
                )
        stored = await store.conversation("run-cut")
    finally:
        await store.close()
    assert (info.value.type, info.value.non_retryable) == ("ModelOutputTruncated", True)
    assert [m.role for m in stored] == ["user"]  # the cut-off answer is not kept


async def test_the_activity_keeps_a_text_answer_cut_short(
    server: LLMServer, sqlite_url: str
) -> None:
    server.reply(200, openai_completion("The answer is", finish_reason="length"))
    env = ActivityEnvironment()
    store = AuditStore(sqlite_url)
    try:
        async with OpenAIChatClient(server.url, model="m") as client:
            activities = ConversationActivities(client, Recorder(store))
            outcome = await env.run(activities.model_turn, model_turn_request("run-short", "go"))
    finally:
        await store.close()
    assert (outcome.response.message.content, outcome.response.stop_reason) == (
        "The answer is",
        "max_tokens",
    )
