"""A client for OpenAI-compatible Chat Completions servers (OpenAI, vLLM, Ollama, LiteLLM, ...).

Tool-call arguments come back as the model's JSON text and stay that text in
``ToolCall.arguments``: malformed JSON must reach the turn workflow, which answers it with an
``invalid arguments`` soft error the model can correct, instead of failing the activity.
"""

from __future__ import annotations

from typing import Any

import httpx

from tooltrail.llm._catalog import arguments_json, read_catalog
from tooltrail.llm._http import HTTPModelClient
from tooltrail.llm.errors import ModelResponseError
from tooltrail.llm.messages import Message, ModelRequest, ModelResponse, Usage
from tooltrail.results import ToolCall

__all__ = ["OPENAI_BASE_URL", "OpenAIChatClient"]

OPENAI_BASE_URL = "https://api.openai.com/v1"
"""OpenAI's own base URL (the client posts to ``{base_url}/chat/completions``)."""

_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


def _message_json(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            # OpenAI wants null, not "", next to tool calls without text.
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_json(call.arguments)},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some compatible servers answer with content parts
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise TypeError(f"content is a {type(content).__name__}")


def _tool_call(index: int, item: Any) -> ToolCall:
    function = item["function"]
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str | dict):
        raise TypeError(f"arguments is a {type(arguments).__name__}")
    # Some compatible servers omit ids; a stable one keeps the results matchable.
    call_id = item.get("id") or f"call_{index}"
    return ToolCall(id=str(call_id), name=str(function["name"]), arguments=arguments)


def _response(body: Any) -> ModelResponse:
    try:
        choice = body["choices"][0]
        message = choice["message"]
        calls = [_tool_call(i, item) for i, item in enumerate(message.get("tool_calls") or [])]
        text = _text(message.get("content"))
        usage = body.get("usage") or {}
        finish = str(choice.get("finish_reason") or ("tool_calls" if calls else "stop"))
        return ModelResponse(
            message=Message.assistant(text, calls),
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
            ),
            stop_reason=_STOP_REASONS.get(finish, finish),
            raw_id=body.get("id"),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"not a Chat Completions response ({type(exc).__name__}: {exc}); "
            "check that the base URL points at an OpenAI-compatible server"
        ) from exc


class OpenAIChatClient(HTTPModelClient):
    """A ``ModelClient`` for any OpenAI-compatible ``POST {base_url}/chat/completions``.

    It never retries: the model activity's retry policy does, with the server's
    ``Retry-After``.
    """

    def __init__(
        self,
        base_url: str = OPENAI_BASE_URL,
        *,
        api_key: str | None = None,
        model: str,
        timeout_s: float = 120.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """Create the client.

        Args:
            base_url: the API root, e.g. ``https://api.openai.com/v1`` or
                ``http://localhost:11434/v1``.
            api_key: sent as ``Authorization: Bearer <key>``; ``None`` sends no header
                (local servers).
            model: the default model, for requests that name none.
            timeout_s: the HTTP timeout of one request (ignored when ``http`` is given).
            http: an httpx client to use instead of a new one; the caller closes it, and
                should give it ``retries=0`` so retries are not doubled.
        """
        super().__init__(timeout_s=timeout_s, http=http)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request``."""
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": [_message_json(message) for message in request.messages],
        }
        if request.tools:
            body["tools"] = [entry.openai() for entry in read_catalog(request.tools)]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        return body

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's reply to ``request``.

        Raises:
            ModelHTTPError: the server answered with an error status.
            ModelConnectionError: the server did not answer.
            ModelResponseError: the answer is not a Chat Completions response.
        """
        body = await self._post(self.url, self._headers, self.request_body(request))
        return _response(body)
