"""A client for Anthropic's Messages API (``POST {base_url}/v1/messages``).

The neutral conversation maps onto Anthropic's shape as follows: system messages become the
top-level ``system`` text; an assistant message becomes ``text`` and ``tool_use`` blocks;
tool messages become ``tool_result`` blocks of a user message. Consecutive messages that map
to the same role are merged into one message, because every result of an assistant turn's
tool calls must arrive in the single user message that follows it.
"""

from __future__ import annotations

from typing import Any

import httpx

from tooltrail.llm._catalog import arguments_object, read_catalog
from tooltrail.llm._http import HTTPModelClient
from tooltrail.llm.errors import ModelResponseError
from tooltrail.llm.messages import Message, ModelRequest, ModelResponse, Usage
from tooltrail.results import ToolCall

__all__ = ["ANTHROPIC_BASE_URL", "ANTHROPIC_VERSION", "AnthropicMessagesClient"]

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
"""Anthropic's API root (the client posts to ``{base_url}/v1/messages``)."""
ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent by default."""


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
                "is_error": message.is_error,
            }
        ]
    # Anthropic rejects empty text blocks.
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": message.content}] if message.content else []
    )
    blocks.extend(
        {
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": arguments_object(call.arguments),
        }
        for call in message.tool_calls
    )
    return blocks


def _conversation(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """Return the system text and the Messages API ``messages`` of a conversation."""
    system = [message.content for message in messages if message.role == "system"]
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return ("\n\n".join(system) if system else None), turns


def _response(body: Any) -> ModelResponse:
    try:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in body["content"]:
            if block["type"] == "text":
                texts.append(str(block["text"]))
            elif block["type"] == "tool_use":
                arguments = block.get("input") or {}
                if not isinstance(arguments, dict):
                    raise TypeError(f"tool_use input is a {type(arguments).__name__}")
                calls.append(
                    ToolCall(id=str(block["id"]), name=str(block["name"]), arguments=arguments)
                )
            # Other blocks (thinking, server tools) are not part of the neutral conversation.
        usage = body.get("usage") or {}
        return ModelResponse(
            message=Message.assistant("".join(texts), calls),
            usage=Usage(
                input_tokens=int(usage.get("input_tokens") or 0),
                output_tokens=int(usage.get("output_tokens") or 0),
            ),
            stop_reason=str(body.get("stop_reason") or ("tool_use" if calls else "end_turn")),
            raw_id=body.get("id"),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"not a Messages API response ({type(exc).__name__}: {exc}); "
            "check that the base URL points at an Anthropic-compatible server"
        ) from exc


class AnthropicMessagesClient(HTTPModelClient):
    """A ``ModelClient`` for Anthropic's Messages API.

    It never retries: the model activity's retry policy does, with the server's
    ``retry-after``.
    """

    _request_id_header = "request-id"

    def __init__(
        self,
        *,
        api_key: str | None,
        model: str,
        base_url: str = ANTHROPIC_BASE_URL,
        anthropic_version: str = ANTHROPIC_VERSION,
        max_tokens: int = 1024,
        timeout_s: float = 120.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """Create the client.

        Args:
            api_key: sent as ``x-api-key``; ``None`` sends no key (a local gateway).
            model: the default model, for requests that name none.
            base_url: the API root, without ``/v1``.
            anthropic_version: the ``anthropic-version`` header.
            max_tokens: the default ``max_tokens`` (the API requires one).
            timeout_s: the HTTP timeout of one request (ignored when ``http`` is given).
            http: an httpx client to use instead of a new one; the caller closes it, and
                should give it ``retries=0`` so retries are not doubled.
        """
        super().__init__(timeout_s=timeout_s, http=http)
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.model = model
        self.max_tokens = max_tokens
        self._headers = {"anthropic-version": anthropic_version}
        if api_key:
            self._headers["x-api-key"] = api_key

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request``."""
        system, messages = _conversation(request.messages)
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_tokens or self.max_tokens,
            "messages": messages,
        }
        if system is not None:
            body["system"] = system
        if request.tools:
            body["tools"] = [entry.anthropic() for entry in read_catalog(request.tools)]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's reply to ``request``.

        Raises:
            ModelHTTPError: the server answered with an error status.
            ModelConnectionError: the server did not answer.
            ModelResponseError: the answer is not a Messages API response.
        """
        body = await self._post(self.url, self._headers, self.request_body(request))
        return _response(body)
