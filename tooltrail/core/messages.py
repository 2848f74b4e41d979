"""The provider-neutral conversation: messages, requests, responses and the client protocol.

Every model client (OpenAI-compatible, Anthropic, scripted) takes a ``ModelRequest`` and
returns a ``ModelResponse``; the provider formats live only inside the clients. The models
are pydantic so the pydantic data converter carries them through Temporal as the input and
output of the ``tooltrail.model.complete`` activity. Fields added later MUST get defaults so
that histories recorded before them still decode.

Pure module: workflow code imports it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal, Protocol, Self

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    model_serializer,
    model_validator,
)
from temporalio.common import RetryPolicy

from tooltrail.core.results import ToolCall, ToolDispatchResult
from tooltrail.core.text import render_text

__all__ = [
    "MODEL_COMPLETE",
    "MODEL_OUTPUT_TRUNCATED",
    "MODEL_REQUEST_REJECTED",
    "MODEL_RESPONSE_INVALID",
    "MODEL_RETRY_POLICY",
    "MODEL_SCRIPT_EXHAUSTED",
    "MODEL_UNAVAILABLE",
    "TRUNCATED_STOP_REASONS",
    "Message",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "Role",
    "StopReason",
    "Thinking",
    "ThinkingSetting",
    "Usage",
]

MODEL_UNAVAILABLE = "ModelUnavailable"
"""``ApplicationError.type`` of a retryable model failure."""
MODEL_REQUEST_REJECTED = "ModelRequestRejected"
"""``ApplicationError.type`` of a request the provider refused for good (a 4xx)."""
MODEL_RESPONSE_INVALID = "ModelResponseInvalid"
"""``ApplicationError.type`` of a success response that could not be read."""
MODEL_SCRIPT_EXHAUSTED = "ModelScriptExhausted"
"""``ApplicationError.type`` of a ``ScriptedModel`` that ran out of responses."""
MODEL_OUTPUT_TRUNCATED = "ModelOutputTruncated"
"""``ApplicationError.type`` of an answer cut off by ``max_tokens`` (or the context window)
while it asked for tools, or before it said anything: the turn fails, no tool runs."""

MODEL_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=6,
    non_retryable_error_types=[
        MODEL_REQUEST_REJECTED,
        MODEL_RESPONSE_INVALID,
        MODEL_SCRIPT_EXHAUSTED,
    ],
)
"""Retry policy for the ``tooltrail.model.complete`` activity: 1, 2, 4, 8, 16 s between the
six attempts (each delay capped at 30 s, or replaced by the server's ``Retry-After``)."""

MODEL_COMPLETE = "tooltrail.model.complete"
"""Reserved: the name of a model-completion activity no worker registers (agent turns ask
the model through ``tooltrail.model.turn``, ``tooltrail.core.wire.MODEL_TURN``). Kept as a public
name of ``tooltrail.llm``; never reuse it for another activity."""

Role = Literal["system", "user", "assistant", "tool"]
"""Who speaks a message."""

StopReason = Literal[
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "refusal",
    "pause_turn",
    "model_context_window_exceeded",
    "content_filter",
]
"""The normalized stop reasons; a provider's other reasons pass through as they are.

- ``end_turn``: the model finished its answer (OpenAI ``stop``);
- ``tool_use``: it wants its tool calls run (OpenAI ``tool_calls``);
- ``max_tokens``: cut off by ``max_tokens`` (OpenAI ``length``);
- ``stop_sequence``: a stop sequence was generated;
- ``refusal``: the model declined (Anthropic's classifiers, or an OpenAI ``refusal``);
- ``pause_turn``: Anthropic paused a long server-tool turn;
- ``model_context_window_exceeded``: the context window ran out mid-answer (Anthropic);
- ``content_filter``: OpenAI's content filter withheld the output.
"""

TRUNCATED_STOP_REASONS: frozenset[str] = frozenset({"max_tokens", "model_context_window_exceeded"})
"""Stop reasons of an answer that was cut off: its tool calls may be incomplete."""

ThinkingSetting = StrictInt | Literal["adaptive", "disabled"]
"""Anthropic extended thinking: a budget in tokens (manual thinking, at least 1024 and below
``max_tokens``), ``"adaptive"`` (the model decides how much to think) or ``"disabled"``.
Strict, so that ``True`` is refused rather than read as a budget of one token."""


def _drop_defaults(
    model: BaseModel, handler: SerializerFunctionWrapHandler, fields: tuple[str, ...]
) -> Any:
    # Fields added after histories were recorded travel only when set: a message or a usage
    # without them is serialized byte for byte as before (every turn's history holds some).
    data = handler(model)
    if isinstance(data, dict):
        for name in fields:
            if name in data and data[name] in (None, [], 0):
                del data[name]
    return data


class Thinking(BaseModel):
    """One thinking block of an assistant answer (Anthropic extended thinking).

    Kept verbatim, signature included: when thinking is on, the API wants the blocks of the
    answer that asked for tools back, unchanged and in order, with the tool results.
    """

    type: Literal["thinking", "redacted_thinking"] = "thinking"
    """``thinking`` (readable, signed) or ``redacted_thinking`` (encrypted by the provider)."""
    thinking: str = ""
    """The thinking text (``thinking`` blocks)."""
    signature: str = ""
    """The provider's signature of the text (``thinking`` blocks)."""
    data: str = ""
    """The encrypted content (``redacted_thinking`` blocks)."""


class Message(BaseModel):
    """One message of a conversation.

    ``tool_calls`` belong to assistant messages only; ``tool_call_id``, ``name`` and
    ``is_error`` to tool messages (the result of one call), which must name their call.
    """

    role: Role
    """Who speaks: ``system``, ``user``, ``assistant`` or ``tool`` (a tool result)."""
    content: str = ""
    """The text; for a tool message, the tool's output as the model reads it."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """Assistant only: the tool calls the model requested, in its order."""
    tool_call_id: str | None = None
    """Tool only: the model-issued id of the call this message answers."""
    name: str | None = None
    """Tool only: the tool's name (informational; providers match results by id)."""
    is_error: bool = False
    """Tool only: the output is a soft error."""
    content_ref: str | None = None
    """A large tool result stored in the database: ``content`` is filled in from it before
    the model sees the message."""
    thinking: list[Thinking] = Field(default_factory=list)
    """Assistant only: the answer's thinking blocks, in order (sent back before its text and
    tool calls). Kept in the conversation in SQL, not in workflow history."""
    refusal: str | None = None
    """Assistant only: the model declined to answer, and said this (OpenAI's ``refusal``, or
    Anthropic's explanation of a ``refusal`` stop)."""

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_defaults(self, handler, ("thinking", "refusal"))

    @model_validator(mode="after")
    def _check_role_fields(self) -> Self:
        if self.role != "assistant":
            for name in ("tool_calls", "thinking"):
                if getattr(self, name):
                    raise ValueError(
                        f"only assistant messages carry {name}, not {self.role!r} ones"
                    )
            if self.refusal is not None:
                raise ValueError(f"only assistant messages carry a refusal, not {self.role!r} ones")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.role != "tool" and (self.tool_call_id is not None or self.is_error):
            raise ValueError(
                f"tool_call_id and is_error belong to tool messages, not {self.role!r} ones"
            )
        return self

    @classmethod
    def system(cls, content: str) -> Message:
        """Return a system message."""
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        """Return a user message."""
        return cls(role="user", content=content)

    @classmethod
    def assistant(
        cls,
        content: str = "",
        tool_calls: list[ToolCall] | None = None,
        *,
        thinking: list[Thinking] | None = None,
        refusal: str | None = None,
    ) -> Message:
        """Return an assistant message with text and/or tool calls.

        Args:
            content: the text.
            tool_calls: the tool calls the model requested.
            thinking: the answer's thinking blocks (Anthropic), in order.
            refusal: the model's refusal text, when it declined.
        """
        return cls(
            role="assistant",
            content=content,
            tool_calls=list(tool_calls or []),
            thinking=list(thinking or []),
            refusal=refusal,
        )

    @classmethod
    def tool(
        cls, tool_call_id: str, content: str, *, name: str | None = None, is_error: bool = False
    ) -> Message:
        """Return the result of one tool call.

        Args:
            tool_call_id: the model-issued id of the call.
            content: the output, as text.
            name: the tool's name.
            is_error: the output is a soft error.
        """
        return cls(
            role="tool", content=content, tool_call_id=tool_call_id, name=name, is_error=is_error
        )

    @classmethod
    def from_result(cls, result: ToolDispatchResult, *, name: str | None = None) -> Message:
        """Return the tool message of a turn's result (multipart output rendered as text).

        Args:
            result: one result of ``TurnOutput.results``.
            name: the tool name the model requested (default: the tool that ran).
        """
        message = cls.tool(
            result.tool_call_id,
            render_text(result.output),
            name=name or result.resolved_tool_name,
            is_error=result.is_error,
        )
        if result.output_ref is not None:
            message = message.model_copy(update={"content_ref": result.output_ref})
        return message


class Usage(BaseModel):
    """Tokens one completion consumed, as the provider reported them (0 when it did not).

    ``input_tokens`` counts every prompt token, cached ones included, for both providers;
    the two cache counts say how many of them were read from or written to the provider's
    prompt cache (billed at their own rates).
    """

    input_tokens: int = 0
    """Prompt tokens, cached ones included (OpenAI ``prompt_tokens``; Anthropic
    ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``)."""
    output_tokens: int = 0
    """Generated tokens, thinking included (OpenAI ``completion_tokens``)."""
    cache_read_tokens: int = 0
    """Of ``input_tokens``, those read from the prompt cache (OpenAI
    ``prompt_tokens_details.cached_tokens``; Anthropic ``cache_read_input_tokens``)."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the prompt cache (OpenAI
    ``prompt_tokens_details.cache_write_tokens``; Anthropic ``cache_creation_input_tokens``)."""
    reasoning_tokens: int = 0
    """Of ``output_tokens``, those the model spent reasoning (OpenAI
    ``completion_tokens_details.reasoning_tokens``; Anthropic does not report them apart)."""

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_defaults(
            self, handler, ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
        )

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        """Return the sum of two usages, field by field."""
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


class ModelRequest(BaseModel):
    """Input of the ``tooltrail.model.complete`` activity and of ``ModelClient.complete``."""

    messages: list[Message]
    """The conversation so far, system messages included."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The tool catalog: ``ToolRegistry.openai_tools()`` or ``anthropic_tools()``; every
    client accepts either format (and plain ``{name, description, parameters}`` entries)."""
    model: str | None = None
    """The model name; ``None`` uses the client's default model."""
    temperature: float | None = None
    """Sampling temperature; ``None`` leaves the provider's default."""
    max_tokens: int | None = None
    """Most tokens to generate; ``None`` leaves the client's default."""
    thinking: ThinkingSetting | None = None
    """Anthropic extended thinking (``ThinkingSetting``); ``None`` leaves the model's default.
    OpenAI-compatible clients ignore it."""
    prompt_caching: bool = False
    """Anthropic: mark the system prompt and the tool definitions for the prompt cache.
    OpenAI caches long prompts by itself."""


class ModelResponse(BaseModel):
    """Output of the ``tooltrail.model.complete`` activity: the assistant's reply."""

    message: Message
    """The assistant message: text and/or tool calls (arguments may be raw JSON text)."""
    usage: Usage = Field(default_factory=Usage)
    """Tokens consumed."""
    stop_reason: StopReason | str = "end_turn"
    """Why generation stopped: one of ``StopReason`` (``tool_use`` when the model wants its
    tool calls run), else the provider's own reason verbatim."""
    raw_id: str | None = None
    """The provider's id of the completion, for support requests and logs."""


class ModelClient(Protocol):
    """What the model activity needs of a model: one completion per call.

    Implementations raise ``ModelError`` subclasses (``ModelHTTPError``,
    ``ModelConnectionError``, ...) for failures, and never retry by themselves: Temporal's
    retry policy owns retries, so a client retry would multiply them.
    """

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's reply to ``request``."""
        ...
