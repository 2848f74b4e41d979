"""A client for OpenAI-compatible Chat Completions servers (OpenAI, vLLM, Ollama, LiteLLM, ...).

It runs on the official ``openai`` SDK (``pip install 'tooltrail[openai]'``), with the SDK's
retries off: the model activity's Temporal retry policy retries, with tooltrail's
classification and the server's ``Retry-After``.

Today's request rules, where the neutral request meets Chat Completions:

- ``max_tokens`` is sent as ``max_completion_tokens`` (``max_tokens`` is deprecated and
  refused by reasoning models); ``max_tokens_field="max_tokens"`` keeps the old name for
  compatible servers that do not know the new one;
- ``temperature`` is sent only to model families that take it: not to the reasoning
  families (``o1``, ``o3``, ``o4``..., ``gpt-5`` and later, ``codex``), which refuse it;
- ``thinking`` is Anthropic's: it is not sent (with a warning);
- no blank assistant text is sent, and a failed tool result with no text says
  ``tool '<name>' failed without a message``;
- a ``refusal`` is read as one (``Message.refusal``, stop reason ``refusal``), and sent back
  as such in later requests.

Tool-call arguments come back as the model's JSON text and stay that text in
``ToolCall.arguments``: malformed JSON must reach the turn workflow, which answers it with an
``invalid arguments`` soft error the model can correct, instead of failing the activity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from tooltrail.core.messages import Message, ModelRequest, ModelResponse, Usage
from tooltrail.core.results import ToolCall
from tooltrail.llm._catalog import arguments_json, read_catalog, tool_result_text
from tooltrail.llm._sdk import SDKModelClient, field, missing_extra, sdk_errors
from tooltrail.llm.errors import ModelResponseError

try:
    import openai
except ImportError as exc:  # the extra is not installed
    raise ImportError(missing_extra("openai", "OpenAIChatClient")) from exc

if TYPE_CHECKING:
    import httpx2

__all__ = ["OPENAI_BASE_URL", "OpenAIChatClient", "takes_temperature"]

OPENAI_BASE_URL = "https://api.openai.com/v1"
"""OpenAI's own base URL (the client posts to ``{base_url}/chat/completions``)."""

_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}

# Reasoning model families: they refuse any temperature but the default. A gateway's
# "provider/model" names are judged by the model part.
_REASONING_FAMILY = re.compile(r"^(o\d|gpt-(\d{2,}|[5-9])|codex)", re.IGNORECASE)

# The SDK insists on a key; a server that wants none gets this one, and the request drops
# the Authorization header (see OpenAIChatClient.complete).
_NO_KEY = "tooltrail-no-key"


def takes_temperature(model: str) -> bool:
    """Return whether an OpenAI model family accepts a ``temperature``.

    The reasoning families (``o1``, ``o3``, ``o4-mini``, ``gpt-5`` and later, ``codex``)
    refuse one; every other model (``gpt-4.1``, ``gpt-4o``, open models on compatible
    servers) takes it.
    """
    return _REASONING_FAMILY.match(model.rsplit("/", 1)[-1]) is None


def _message_param(message: Message) -> dict[str, Any] | None:
    """The Chat Completions message of ``message``; ``None`` leaves it out."""
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": tool_result_text(message),
        }
    if message.role != "assistant":
        return {"role": message.role, "content": message.content}
    text = message.content if message.content.strip() else None
    if text is None and not message.tool_calls and message.refusal is None:
        return None  # nothing said: a blank assistant message is not sent
    param: dict[str, Any] = {"role": "assistant", "content": text}
    if message.refusal is not None:
        param["refusal"] = message.refusal
    if message.tool_calls:
        param["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_json(call.arguments)},
            }
            for call in message.tool_calls
        ]
    return param


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
    function = field(item, "function")
    name = field(function, "name")
    arguments = field(function, "arguments") if _has(function, "arguments") else None
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str | dict):
        raise TypeError(f"arguments is a {type(arguments).__name__}")
    # Some compatible servers omit ids; a stable one keeps the results matchable.
    call_id = (field(item, "id") if _has(item, "id") else None) or f"call_{index}"
    if not isinstance(name, str):
        raise TypeError(f"tool name is a {type(name).__name__}")
    return ToolCall(id=str(call_id), name=name, arguments=arguments)


def _has(item: Any, name: str) -> bool:
    return name in item if isinstance(item, dict) else getattr(item, name, None) is not None


def _count(details: Any, name: str) -> int:
    value = getattr(details, name, None) if details is not None else None
    return int(value or 0)


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    details = getattr(usage, "prompt_tokens_details", None)
    return Usage(
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cache_read_tokens=_count(details, "cached_tokens"),
        cache_write_tokens=_count(details, "cache_write_tokens"),
        reasoning_tokens=_count(
            getattr(usage, "completion_tokens_details", None), "reasoning_tokens"
        ),
    )


def _response(completion: Any) -> ModelResponse:
    try:
        choice = completion.choices[0]
        message = field(choice, "message")
        calls = [
            _tool_call(i, item)
            for i, item in enumerate(
                (field(message, "tool_calls") if _has(message, "tool_calls") else None) or []
            )
        ]
        text = _text(field(message, "content") if _has(message, "content") else None)
        refusal = field(message, "refusal") if _has(message, "refusal") else None
        finish = field(choice, "finish_reason") if _has(choice, "finish_reason") else None
        if not finish:  # some compatible servers leave it out
            stop_reason = "tool_use" if calls else "end_turn"
        else:
            stop_reason = _STOP_REASONS.get(str(finish), str(finish))
        if refusal and stop_reason == "end_turn":
            stop_reason = "refusal"
        return ModelResponse(
            message=Message.assistant(text, calls, refusal=str(refusal) if refusal else None),
            usage=_usage(completion.usage),
            stop_reason=stop_reason,
            raw_id=completion.id,
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"not a Chat Completions response ({type(exc).__name__}: {exc}); "
            "check that the base URL points at an OpenAI-compatible server"
        ) from exc


class OpenAIChatClient(SDKModelClient):
    """A ``ModelClient`` for any OpenAI-compatible ``POST {base_url}/chat/completions``.

    It runs on the official ``openai`` SDK with its retries off: the model activity's retry
    policy retries, with the server's ``Retry-After``.
    """

    def __init__(
        self,
        base_url: str = OPENAI_BASE_URL,
        *,
        api_key: str | None = None,
        model: str,
        timeout_s: float | None = None,
        http: httpx2.AsyncClient | None = None,
        organization: str | None = None,
        project: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = (
            "max_completion_tokens"
        ),
        sdk_client: openai.AsyncOpenAI | None = None,
    ) -> None:
        """Create the client.

        Args:
            base_url: the API root, e.g. ``https://api.openai.com/v1`` or
                ``http://localhost:11434/v1``.
            api_key: sent as ``Authorization: Bearer <key>``; ``None`` sends no
                ``Authorization`` header (local servers). The SDK's ``OPENAI_API_KEY`` is
                not read: tooltrail's settings (``TOOLTRAIL_OPENAI_API_KEY``) give the key.
            model: the default model, for requests that name none.
            timeout_s: the timeout of one request; ``None`` keeps the SDK's default (600 s,
                5 s to connect). Ignored with ``http`` (its own timeout counts).
            http: an ``httpx2.AsyncClient`` for the SDK to use (proxies, TLS); the caller
                closes it.
            organization: the ``OpenAI-Organization`` header (default: the SDK's
                ``OPENAI_ORG_ID``).
            project: the ``OpenAI-Project`` header (default: the SDK's ``OPENAI_PROJECT_ID``).
            headers: more headers for every request (a gateway's, for instance).
            max_tokens_field: the body field that carries ``max_tokens``:
                ``max_completion_tokens`` (today's API) or ``max_tokens`` (older compatible
                servers).
            sdk_client: an ``openai.AsyncOpenAI`` to use instead (Azure, Bedrock, ...): the
                other connection arguments are ignored, its retries are turned off for
                this client's calls, and the caller closes it.
        """
        self.model = model
        self.max_tokens_field = max_tokens_field
        self._no_key = sdk_client is None and not api_key
        if sdk_client is None:
            options: dict[str, Any] = {}
            if timeout_s is not None:
                options["timeout"] = timeout_s
            sdk_client = openai.AsyncOpenAI(
                api_key=api_key or _NO_KEY,
                base_url=base_url,
                organization=organization,
                project=project,
                default_headers=dict(headers or {}),
                http_client=http,
                max_retries=0,
                **options,
            )
            owned = http is None
        else:
            sdk_client = sdk_client.with_options(max_retries=0)
            owned = False
        super().__init__(sdk_client, owned=owned)
        self._openai: openai.AsyncOpenAI = sdk_client
        self.url = str(sdk_client.base_url).rstrip("/") + "/chat/completions"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request`` (the SDK's ``create`` arguments)."""
        model = request.model or self.model
        messages = [_message_param(message) for message in request.messages]
        body: dict[str, Any] = {
            "model": model,
            "messages": [param for param in messages if param is not None],
        }
        if request.tools:
            body["tools"] = [entry.openai() for entry in read_catalog(request.tools)]
        if request.temperature is not None:
            if takes_temperature(model):
                body["temperature"] = request.temperature
            else:
                self._drop_once("temperature", model, "reasoning models refuse it")
        if request.max_tokens is not None:
            body[self.max_tokens_field] = request.max_tokens
        if request.thinking is not None:
            self._drop_once("thinking", model, "Chat Completions has no thinking switch")
        return body

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's reply to ``request``.

        Raises:
            ModelHTTPError: the server answered with an error status.
            ModelConnectionError: the server did not answer.
            ModelResponseError: the answer is not a Chat Completions response.
            ModelRequestError: the SDK refused to send the request.
        """
        body = self.request_body(request)
        extra_headers = {"Authorization": openai.omit} if self._no_key else None
        with sdk_errors(openai, self.url):
            completion = await self._openai.chat.completions.create(
                **body, extra_headers=extra_headers
            )
        return _response(completion)
