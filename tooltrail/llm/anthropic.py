"""A client for Anthropic's Messages API (``POST {base_url}/v1/messages``).

It runs on the official ``anthropic`` SDK (``pip install 'tooltrail[anthropic]'``), with the
SDK's retries off: the model activity's Temporal retry policy retries, with tooltrail's
classification and the server's ``retry-after``.

The neutral conversation maps onto Anthropic's shape as follows: system messages become the
top-level ``system`` text; an assistant message becomes its ``thinking`` /
``redacted_thinking`` blocks (verbatim, signatures included), then ``text`` and ``tool_use``
blocks; tool messages become ``tool_result`` blocks of a user message. Consecutive messages
that map to the same role are merged into one message, because every result of an assistant
turn's tool calls must arrive in the single user message that follows it.

Today's request rules:

- ``temperature`` is never sent: the SDK's ``messages.create`` takes none, and newer models
  refuse it (a run that set one for another provider still runs, with a warning logged);
- ``max_tokens`` defaults to 8192 (the API requires one); with a thinking budget and no
  ``max_tokens``, the budget comes on top;
- no blank text block is sent, and a failed tool result with no text says
  ``tool '<name>' failed without a message`` (the API refuses an empty ``is_error`` result);
- ``ModelRequest.thinking`` switches extended thinking (``{"type": "enabled",
  "budget_tokens": N}``, ``adaptive`` or ``disabled``), and ``prompt_caching`` marks the
  system prompt and the last tool definition with ``cache_control``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tooltrail.core.messages import Message, ModelRequest, ModelResponse, Thinking, Usage
from tooltrail.core.results import ToolCall
from tooltrail.llm._catalog import arguments_object, read_catalog, tool_result_text
from tooltrail.llm._sdk import SDKModelClient, field, missing_extra, sdk_errors
from tooltrail.llm.errors import ModelResponseError

try:
    import anthropic
except ImportError as exc:  # the extra is not installed
    raise ImportError(missing_extra("anthropic", "AnthropicMessagesClient")) from exc

if TYPE_CHECKING:
    import httpx2

__all__ = ["ANTHROPIC_BASE_URL", "DEFAULT_MAX_TOKENS", "AnthropicMessagesClient"]

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
"""Anthropic's API root (the client posts to ``{base_url}/v1/messages``)."""
DEFAULT_MAX_TOKENS = 8192
"""``max_tokens`` of requests that set none: every current model can write this much, and
the SDK sends it without streaming (it refuses budgets it expects to take over 10 minutes)."""

_EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}

# The SDK insists on a credential; a gateway that wants none gets this one, and the request
# drops the Authorization header (see AnthropicMessagesClient.complete).
_NO_KEY = "tooltrail-no-key"


def _thinking_block(block: Thinking) -> dict[str, Any]:
    if block.type == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id,
            "content": tool_result_text(message),
        }
        if message.is_error:
            result["is_error"] = True
        return [result]
    # Thinking first: an answer's blocks go back in their order, and thinking opens it.
    blocks = [_thinking_block(block) for block in message.thinking]
    # Anthropic rejects empty and whitespace-only text blocks.
    if message.content.strip():
        blocks.append({"type": "text", "text": message.content})
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
        blocks = _blocks(message)
        if not blocks:
            continue  # nothing said (a blank text): Anthropic refuses empty content
        role = "assistant" if message.role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    text = "\n\n".join(part for part in system if part.strip())
    return (text or None), turns


def _refusal(body: Any) -> str:
    details = getattr(body, "stop_details", None)
    explanation = getattr(details, "explanation", None)
    if explanation:
        return str(explanation)
    category = getattr(details, "category", None)
    if category:
        return f"the model declined to answer (category {category!r})"
    return "the model declined to answer"


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    read = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
    written = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
    return Usage(
        # Anthropic counts the uncached part only; tooltrail counts every prompt token.
        input_tokens=int(getattr(usage, "input_tokens", 0) or 0) + read + written,
        output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
        cache_read_tokens=read,
        cache_write_tokens=written,
    )


def _response(body: Any) -> ModelResponse:
    try:
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[Thinking] = []
        for block in body.content:
            kind = field(block, "type")
            if kind == "text":
                texts.append(str(field(block, "text")))
            elif kind == "tool_use":
                arguments = field(block, "input") or {}
                if not isinstance(arguments, dict):
                    raise TypeError(f"tool_use input is a {type(arguments).__name__}")
                calls.append(
                    ToolCall(
                        id=str(field(block, "id")),
                        name=str(field(block, "name")),
                        arguments=arguments,
                    )
                )
            elif kind == "thinking":
                thinking.append(
                    Thinking(
                        thinking=str(field(block, "thinking")),
                        signature=str(field(block, "signature")),
                    )
                )
            elif kind == "redacted_thinking":
                thinking.append(Thinking(type="redacted_thinking", data=str(field(block, "data"))))
            # Server tools' blocks are not part of the neutral conversation.
        stop_reason = str(body.stop_reason or ("tool_use" if calls else "end_turn"))
        return ModelResponse(
            message=Message.assistant(
                "".join(texts),
                calls,
                thinking=thinking,
                refusal=_refusal(body) if stop_reason == "refusal" else None,
            ),
            usage=_usage(body.usage),
            stop_reason=stop_reason,
            raw_id=body.id,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"not a Messages API response ({type(exc).__name__}: {exc}); "
            "check that the base URL points at an Anthropic-compatible server"
        ) from exc


class AnthropicMessagesClient(SDKModelClient):
    """A ``ModelClient`` for Anthropic's Messages API.

    It runs on the official ``anthropic`` SDK with its retries off: the model activity's
    retry policy retries, with the server's ``retry-after``.
    """

    def __init__(
        self,
        *,
        api_key: str | None,
        model: str,
        base_url: str = ANTHROPIC_BASE_URL,
        anthropic_version: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout_s: float | None = None,
        http: httpx2.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
        sdk_client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        """Create the client.

        Args:
            api_key: the API key; ``None`` sends no ``Authorization`` header (a local
                gateway). The SDK's own credential lookup (``ANTHROPIC_API_KEY``, profiles)
                is not used: tooltrail's settings (``TOOLTRAIL_ANTHROPIC_API_KEY``) give it.
            model: the default model, for requests that name none.
            base_url: the API root, without ``/v1``.
            anthropic_version: the ``anthropic-version`` header; ``None`` sends the SDK's.
            max_tokens: the default ``max_tokens`` (the API requires one).
            timeout_s: the timeout of one request; ``None`` keeps the SDK's default (600 s,
                5 s to connect). Ignored with ``http`` (its own timeout counts).
            http: an ``httpx2.AsyncClient`` for the SDK to use (proxies, TLS); the caller
                closes it.
            headers: more headers for every request, e.g. ``{"anthropic-beta": ...}``.
            sdk_client: an ``anthropic.AsyncAnthropic`` to use instead (Bedrock, Vertex,
                ...): the other connection arguments are ignored, its retries are turned
                off for this client's calls, and the caller closes it.
        """
        self.model = model
        self.max_tokens = max_tokens
        self._no_key = sdk_client is None and not api_key
        if sdk_client is None:
            default_headers = dict(headers or {})
            if anthropic_version is not None:
                default_headers["anthropic-version"] = anthropic_version
            options: dict[str, Any] = {}
            if timeout_s is not None:
                options["timeout"] = timeout_s
            sdk_client = anthropic.AsyncAnthropic(
                api_key=api_key or _NO_KEY,
                base_url=base_url,
                default_headers=default_headers,
                http_client=http,
                max_retries=0,
                **options,
            )
            owned = http is None
        else:
            sdk_client = sdk_client.with_options(max_retries=0)
            owned = False
        super().__init__(sdk_client, owned=owned)
        self._anthropic: anthropic.AsyncAnthropic = sdk_client
        self.url = str(sdk_client.base_url).rstrip("/") + "/v1/messages"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request`` (the SDK's ``create`` arguments)."""
        model = request.model or self.model
        system, messages = _conversation(request.messages)
        thinking = request.thinking
        budget = thinking if isinstance(thinking, int) else 0
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": request.max_tokens or self.max_tokens + budget,
            "messages": messages,
        }
        if system is not None:
            body["system"] = (
                [{"type": "text", "text": system, "cache_control": dict(_EPHEMERAL)}]
                if request.prompt_caching
                else system
            )
        if request.tools:
            tools = [entry.anthropic() for entry in read_catalog(request.tools)]
            if request.prompt_caching:
                # One breakpoint after the last tool caches every definition before it.
                tools[-1]["cache_control"] = dict(_EPHEMERAL)
            body["tools"] = tools
        if isinstance(thinking, int):
            body["thinking"] = {"type": "enabled", "budget_tokens": thinking}
        elif thinking is not None:
            body["thinking"] = {"type": thinking}
        if request.temperature is not None:
            self._drop_once(
                "temperature", model, "the Messages API of the anthropic SDK takes no temperature"
            )
        return body

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's reply to ``request``.

        Raises:
            ModelHTTPError: the server answered with an error status.
            ModelConnectionError: the server did not answer.
            ModelResponseError: the answer is not a Messages API response.
            ModelRequestError: the SDK refused to send the request (e.g. a ``max_tokens``
                it expects to take over 10 minutes without streaming).
        """
        body = self.request_body(request)
        extra_headers = {"Authorization": anthropic.omit} if self._no_key else None
        with sdk_errors(anthropic, self.url):
            message = await self._anthropic.messages.create(**body, extra_headers=extra_headers)
        return _response(message)
