"""Calls, outputs and results: the values that cross every boundary.

All of them are pydantic models so the pydantic data converter carries them through Temporal
unchanged. This module is pure; workflow code imports it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ImagePart",
    "Part",
    "TextPart",
    "ToolCall",
    "ToolDispatchResult",
    "ToolOutput",
]


class TextPart(BaseModel):
    """A text part of a multipart output."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["text"] = "text"
    text: str
    """The text."""

    def __init__(self, text: str | None = None, /, **data: Any) -> None:
        """Create a part: ``TextPart("hello")`` or ``TextPart(text="hello")``."""
        if text is not None:
            data["text"] = text
        super().__init__(**data)


class ImagePart(BaseModel):
    """An image part of a multipart output, base64-encoded."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["image"] = "image"
    media_type: str
    """MIME type, e.g. ``image/png``."""
    data_b64: str
    """The image bytes, base64-encoded."""

    def __init__(
        self, media_type: str | None = None, data_b64: str | None = None, /, **data: Any
    ) -> None:
        """Create a part: ``ImagePart("image/png", b64)`` or with keywords."""
        if media_type is not None:
            data["media_type"] = media_type
        if data_b64 is not None:
            data["data_b64"] = data_b64
        super().__init__(**data)


Part = Annotated[TextPart | ImagePart, Field(discriminator="kind")]
"""One part of a multipart output."""


class ToolOutput(BaseModel):
    """What a tool may return when plain text is not enough.

    Exactly one of ``text`` and ``parts`` is normally set; with neither, the output is empty
    text.
    """

    model_config = ConfigDict(frozen=True)

    text: str | None = None
    """Text output."""
    parts: list[Part] | None = None
    """Multipart output (text and images)."""
    is_error: bool = False
    """Report a soft error without raising."""
    display_hint: str | None = None
    """A hint for user interfaces (never shown to the model)."""


class ToolCall(BaseModel):
    """One tool call requested by the model.

    ``arguments`` is either a mapping or the model's raw JSON text; raw text that does not
    parse to a JSON object becomes the soft result ``invalid arguments: <reason>`` and the
    tool never runs.
    """

    id: str
    """The model-issued tool-call id."""
    name: str
    """The requested tool name."""
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """The arguments, as a mapping or as raw JSON text."""

    def __init__(
        self,
        id: str | None = None,
        name: str | None = None,
        arguments: dict[str, Any] | str | None = None,
        /,
        **data: Any,
    ) -> None:
        """Create a call: ``ToolCall("c1", "echo", {"text": "hi"})`` or with keywords."""
        for key, value in (("id", id), ("name", name), ("arguments", arguments)):
            if value is not None:
                data[key] = value
        super().__init__(**data)


class ToolDispatchResult(BaseModel):
    """The result of one call, as the model will read it back."""

    tool_call_id: str
    """The model-issued id, stamped by the engine after the pipeline."""
    output: str | list[Part]
    """Text, or a list of parts for multipart output."""
    is_error: bool
    """True for a soft error."""
    duration_ms: float
    """Wall-clock time of the execution (0 for refusals and pre-answered calls)."""
    resolved_tool_name: str
    """The tool that actually ran (differs from the requested name only after renaming)."""
    display_hint: str | None = None
    """A hint for user interfaces."""
    output_ref: str | None = None
    """Inside workflows only: a large output is stored in the database under this key and
    ``output`` is empty (the client fills it back in before you see the result)."""
