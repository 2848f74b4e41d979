"""Model clients behind one small protocol, and the retry rules of the model activity.

``ModelClient.complete`` takes a ``ModelRequest`` (messages and a tool catalog) and returns
a ``ModelResponse`` (an assistant message with text, tool calls and thinking, why the model
stopped, and token usage). Implementations: ``OpenAIChatClient`` (any OpenAI-compatible
server, on the ``openai`` SDK: ``pip install 'tooltrail[openai]'``),
``AnthropicMessagesClient`` (on the ``anthropic`` SDK: ``tooltrail[anthropic]``) and
``ScriptedModel`` (tests and the demo).

Importing this package loads no SDK and no HTTP client: the messages, errors and
``MODEL_RETRY_POLICY`` are pure and workflow code may import them; the provider clients and
``build_model_client`` load on first use (an ``ImportError`` naming the extra when their SDK
is missing).

May import: ``tooltrail.errors``, ``tooltrail.core`` and ``tooltrail.settings``; the providers'
SDKs load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tooltrail.core.messages import (
    MODEL_COMPLETE,
    TRUNCATED_STOP_REASONS,
    Message,
    ModelClient,
    ModelRequest,
    ModelResponse,
    Role,
    StopReason,
    Thinking,
    ThinkingSetting,
    Usage,
)
from tooltrail.llm.errors import (
    MAX_RETRY_AFTER_S,
    MODEL_OUTPUT_TRUNCATED,
    MODEL_REQUEST_REJECTED,
    MODEL_RESPONSE_INVALID,
    MODEL_RETRY_POLICY,
    MODEL_SCRIPT_EXHAUSTED,
    MODEL_UNAVAILABLE,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelRequestError,
    ModelResponseError,
    ScriptExhaustedError,
    classify,
    parse_retry_after,
    to_application_error,
)
from tooltrail.llm.scripted import ScriptedModel, ScriptStep, text_response, tool_call_response

if TYPE_CHECKING:
    from tooltrail.llm.anthropic import AnthropicMessagesClient
    from tooltrail.llm.factory import Provider, build_model_client
    from tooltrail.llm.openai import OpenAIChatClient

__all__ = [
    "MAX_RETRY_AFTER_S",
    "MODEL_COMPLETE",
    "MODEL_OUTPUT_TRUNCATED",
    "MODEL_REQUEST_REJECTED",
    "MODEL_RESPONSE_INVALID",
    "MODEL_RETRY_POLICY",
    "MODEL_SCRIPT_EXHAUSTED",
    "MODEL_UNAVAILABLE",
    "TRUNCATED_STOP_REASONS",
    "AnthropicMessagesClient",
    "Message",
    "ModelClient",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelRequest",
    "ModelRequestError",
    "ModelResponse",
    "ModelResponseError",
    "OpenAIChatClient",
    "Provider",
    "Role",
    "ScriptExhaustedError",
    "ScriptStep",
    "ScriptedModel",
    "StopReason",
    "Thinking",
    "ThinkingSetting",
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
