"""The provider-neutral conversation: messages, requests, responses and the client protocol.

Every model client (OpenAI-compatible, Anthropic, scripted) takes a ``ModelRequest`` and
returns a ``ModelResponse``; the provider formats live only inside the clients. The models
are pydantic so the pydantic data converter carries them through Temporal as the input and
output of the ``tooltrail.model.complete`` activity. Fields added later MUST get defaults so
that histories recorded before them still decode.

Pure module: workflow code imports it.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, Self

from pydantic import BaseModel, Field, model_validator

from tooltrail.results import ToolCall, ToolDispatchResult
from tooltrail.text import render_text

__all__ = [
    "MODEL_COMPLETE",
    "Message",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "Role",
    "StopReason",
    "Usage",
]

MODEL_COMPLETE = "tooltrail.model.complete"
"""Activity: one model completion (``ModelRequest`` in, ``ModelResponse`` out)."""

Role = Literal["system", "user", "assistant", "tool"]
"""Who speaks a message."""

StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence"]
"""The normalized stop reasons; a provider's other reasons pass through as they are."""


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

    @model_validator(mode="after")
    def _check_role_fields(self) -> Self:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role!r} ones")
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
    def assistant(cls, content: str = "", tool_calls: list[ToolCall] | None = None) -> Message:
        """Return an assistant message with text and/or tool calls."""
        return cls(role="assistant", content=content, tool_calls=list(tool_calls or []))

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
    """Tokens one completion consumed, as the provider reported them (0 when it did not)."""

    input_tokens: int = 0
    """Prompt tokens (OpenAI ``prompt_tokens``)."""
    output_tokens: int = 0
    """Generated tokens (OpenAI ``completion_tokens``)."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


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
