"""Model clients behind one small protocol, and the retry rules of the model activity.

``ModelClient.complete`` takes a ``ModelRequest`` (messages and a tool catalog) and returns
a ``ModelResponse`` (an assistant message with text and tool calls, plus token usage).
Implementations: ``OpenAIChatClient`` (any OpenAI-compatible server),
``AnthropicMessagesClient`` and ``ScriptedModel`` (tests and the demo).

Importing this package loads no HTTP client: the messages, errors and ``MODEL_RETRY_POLICY``
are pure and workflow code may import them; the HTTP clients and ``build_model_client`` load
on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tooltrail.llm.errors import (
    MAX_RETRY_AFTER_S,
    MODEL_REQUEST_REJECTED,
    MODEL_RESPONSE_INVALID,
    MODEL_RETRY_POLICY,
    MODEL_SCRIPT_EXHAUSTED,
    MODEL_UNAVAILABLE,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelResponseError,
    ScriptExhaustedError,
    classify,
    parse_retry_after,
    to_application_error,
)
from tooltrail.llm.messages import (
    MODEL_COMPLETE,
    Message,
    ModelClient,
    ModelRequest,
    ModelResponse,
    Role,
    StopReason,
    Usage,
)
from tooltrail.llm.scripted import ScriptedModel, ScriptStep, text_response, tool_call_response

if TYPE_CHECKING:
    from tooltrail.llm.anthropic import AnthropicMessagesClient
    from tooltrail.llm.factory import Provider, build_model_client
    from tooltrail.llm.openai import OpenAIChatClient

__all__ = [
    "MAX_RETRY_AFTER_S",
    "MODEL_COMPLETE",
    "MODEL_REQUEST_REJECTED",
    "MODEL_RESPONSE_INVALID",
    "MODEL_RETRY_POLICY",
    "MODEL_SCRIPT_EXHAUSTED",
    "MODEL_UNAVAILABLE",
    "AnthropicMessagesClient",
    "Message",
    "ModelClient",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelRequest",
    "ModelResponse",
    "ModelResponseError",
    "OpenAIChatClient",
    "Provider",
    "Role",
    "ScriptExhaustedError",
    "ScriptStep",
    "ScriptedModel",
    "StopReason",
    "Usage",
    "build_model_client",
    "classify",
    "parse_retry_after",
    "text_response",
    "to_application_error",
    "tool_call_response",
]

_LAZY = {
    "AnthropicMessagesClient": "tooltrail.llm.anthropic",
    "OpenAIChatClient": "tooltrail.llm.openai",
    "Provider": "tooltrail.llm.factory",
    "build_model_client": "tooltrail.llm.factory",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
