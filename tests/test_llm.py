"""Model clients against a real local HTTP server, the retry mapping, and the model activity."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import tooltrail.llm
from tests.support.llm_server import Disconnect, LLMServer, anthropic_message, openai_completion
from tooltrail.activities.model import ModelActivities
from tooltrail.errors import ConfigurationError
from tooltrail.llm import (
    MODEL_COMPLETE,
    MODEL_RETRY_POLICY,
    AnthropicMessagesClient,
    Message,
    ModelConnectionError,
    ModelHTTPError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    OpenAIChatClient,
    ScriptedModel,
    ScriptExhaustedError,
    Usage,
    build_model_client,
    classify,
    parse_retry_after,
    text_response,
    to_application_error,
    tool_call_response,
)
from tooltrail.results import TextPart, ToolCall, ToolDispatchResult
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


async def expect_error(client: OpenAIChatClient | AnthropicMessagesClient) -> BaseException:
    with pytest.raises((ModelHTTPError, ModelConnectionError, ModelResponseError)) as info:
        await client.complete(ModelRequest(messages=[Message.user("hi")]))
    return info.value


# -- OpenAI-compatible ----------------------------------------------------------------------


async def test_openai_request_shape(server: LLMServer, registry: ToolRegistry) -> None:
    server.reply(200, openai_completion("ok"))
    async with OpenAIChatClient(f"{server.url}/v1/", api_key="sk-test", model="m-default") as cl:
        await cl.complete(
            ModelRequest(
                messages=conversation(),
                tools=registry.openai_tools(),
                model="m-request",
                temperature=0.2,
                max_tokens=50,
            )
        )
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body == {
        "model": "m-request",
        "messages": [
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
        ],
        "tools": registry.openai_tools(),
        "temperature": 0.2,
        "max_tokens": 50,
    }


async def test_openai_defaults_and_anthropic_catalog(
    server: LLMServer, registry: ToolRegistry
) -> None:
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
    assert "max_tokens" not in sent.body
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


# -- Anthropic ------------------------------------------------------------------------------


async def test_anthropic_request_shape(server: LLMServer, registry: ToolRegistry) -> None:
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    async with AnthropicMessagesClient(
        base_url=server.url, api_key="ak-test", model="claude-test", max_tokens=256
    ) as client:
        await client.complete(
            ModelRequest(
                messages=[*conversation(), Message.user("thanks")],
                tools=registry.anthropic_tools(),
                temperature=0.0,
            )
        )
    [sent] = server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "ak-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.body == {
        "model": "claude-test",
        "max_tokens": 256,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2 and 3+3?"}]},
            {
                "role": "assistant",
                "content": [
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
                    {"type": "tool_result", "tool_use_id": "c1", "content": "4", "is_error": False},
                    {
                        "type": "tool_result",
                        "tool_use_id": "c2",
                        "content": "boom",
                        "is_error": True,
                    },
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
        "tools": registry.anthropic_tools(),
        "temperature": 0.0,
    }


async def test_anthropic_accepts_openai_catalog(server: LLMServer, registry: ToolRegistry) -> None:
    server.reply(200, anthropic_message({"type": "text", "text": "ok"}))
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        await client.complete(
            ModelRequest(messages=[Message.user("hi")], tools=registry.openai_tools())
        )
    [sent] = server.requests
    assert sent.body["tools"] == registry.anthropic_tools()
    assert sent.body["max_tokens"] == 1024
    assert "system" not in sent.body


async def test_anthropic_response_mapping(server: LLMServer) -> None:
    server.reply(
        200,
        anthropic_message(
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
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
            id="msg_abc",
        ),
    )
    async with AnthropicMessagesClient(base_url=server.url, api_key="k", model="c") as client:
        response = await client.complete(ModelRequest(messages=[Message.user("2+2?")]))
    assert response == ModelResponse(
        message=Message.assistant(
            "Computing.", [ToolCall("toolu_1", "calculate", {"expression": "2+2"})]
        ),
        usage=Usage(input_tokens=40, output_tokens=9),
        stop_reason="tool_use",
        raw_id="msg_abc",
    )


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


async def test_dropped_connection_is_retryable(server: LLMServer) -> None:
    server.enqueue(Disconnect())
    async with OpenAIChatClient(server.url, model="m") as client:
        error = await expect_error(client)
    assert isinstance(error, ModelConnectionError)
    assert isinstance(error.__cause__, httpx.TransportError)
    app = to_application_error(error)
    assert (app.type, app.non_retryable) == ("ModelUnavailable", False)


async def test_refused_connection_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIChatClient(f"http://127.0.0.1:{port}", model="m", timeout_s=5) as client:
        error = await expect_error(client)
    assert isinstance(error, ModelConnectionError)
    assert not to_application_error(error).non_retryable


def test_raw_transport_error_is_retryable() -> None:
    app = to_application_error(httpx.ReadTimeout("read timed out"))
    assert (app.type, app.non_retryable) == ("ModelUnavailable", False)


async def test_non_json_success_is_final(server: LLMServer) -> None:
    server.reply(200, b"<html>login page</html>")
    server.reply(200, {"unexpected": True})
    async with OpenAIChatClient(server.url, model="m") as client:
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
    assert (first.path, first.headers["x-api-key"], first.body["model"]) == (
        "/v1/messages",
        "from-env",
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


def test_package_root_loads_no_http_client() -> None:
    # Workflow code imports tooltrail.llm for the models and the retry policy.
    code = "import sys, tooltrail.llm; assert 'httpx' not in sys.modules, 'httpx imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_surface() -> None:
    for name in tooltrail.llm.__all__:
        assert getattr(tooltrail.llm, name) is not None
    with pytest.raises(AttributeError):
        _ = tooltrail.llm.NoSuchThing


# -- the activity, in a real activity environment -------------------------------------------


async def test_activity_maps_429_to_retryable_error_with_delay(server: LLMServer) -> None:
    server.reply(429, {"error": {"message": "Rate limit"}}, retry_after_ms="1500")
    server.reply(200, openai_completion("4"))
    env = ActivityEnvironment()
    async with OpenAIChatClient(server.url, model="m") as client:
        activities = ModelActivities(client)
        assert activities.complete.__temporal_activity_definition.name == MODEL_COMPLETE  # type: ignore[attr-defined]
        request = ModelRequest(messages=[Message.user("2+2?")])
        with pytest.raises(ApplicationError) as info:
            await env.run(activities.complete, request)
        assert info.value.type == "ModelUnavailable"
        assert not info.value.non_retryable
        assert info.value.next_retry_delay == timedelta(milliseconds=1500)
        assert isinstance(info.value.__cause__, ModelHTTPError)
        response = await env.run(activities.complete, request)
    assert response.message.content == "4"
    assert len(server.requests) == 2
