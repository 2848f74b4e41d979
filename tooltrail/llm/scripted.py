"""A model that answers from a script: for tests, the demo and offline development."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tooltrail.core.messages import Message, ModelRequest, ModelResponse, Usage
from tooltrail.core.results import ToolCall
from tooltrail.llm.errors import ScriptExhaustedError

__all__ = ["ScriptStep", "ScriptedModel", "text_response", "tool_call_response"]

ScriptStep = ModelResponse | Callable[[ModelRequest], ModelResponse]
"""One scripted answer: a response, or a function of the request that returns one."""


class ScriptedModel:
    """A ``ModelClient`` that returns scripted responses in order, one per call.

    Every request is kept in ``requests``, so a test can check what the model was sent.
    """

    def __init__(self, responses: Iterable[ScriptStep]) -> None:
        """Create the model.

        Args:
            responses: the answers, in order; a callable gets the request and returns the
                answer (to echo tool results, or to check the request).
        """
        self._script: list[ScriptStep] = list(responses)
        self.requests: list[ModelRequest] = []
        """Every request received, in order."""

    @property
    def remaining(self) -> int:
        """How many scripted responses are left."""
        return len(self._script) - len(self.requests)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the next scripted response.

        Raises:
            ScriptExhaustedError: every scripted response was already used.
        """
        index = len(self.requests)
        if index >= len(self._script):
            raise ScriptExhaustedError(
                f"ScriptedModel has no response for request #{index + 1}: its script has "
                f"{len(self._script)}; add responses to the script or end the loop earlier"
            )
        # The list is copied, the messages are shared: a deep copy of the whole conversation
        # per call would make a long scripted run quadratic (requests are built per call).
        self.requests.append(request.model_copy(update={"messages": list(request.messages)}))
        step = self._script[index]
        response = step(request) if callable(step) else step
        # A copy, so a caller that edits the response cannot change the script.
        return response.model_copy(deep=True)


def tool_call_response(
    *calls: ToolCall | tuple[str, str, dict[str, Any] | str],
    text: str = "",
    usage: Usage | None = None,
) -> ModelResponse:
    """Return an assistant response that asks for tool calls.

    Args:
        *calls: ``ToolCall``s, or ``(id, name, arguments)`` tuples; arguments may be raw
            JSON text.
        text: text the assistant says alongside the calls.
        usage: the reported token usage (default: none).

    Example:
        ``tool_call_response(("c1", "calculate", {"expression": "2+2"}))``
    """
    tool_calls = [call if isinstance(call, ToolCall) else ToolCall(*call) for call in calls]
    return ModelResponse(
        message=Message.assistant(text, tool_calls),
        usage=usage or Usage(),
        stop_reason="tool_use",
    )


def text_response(text: str, *, usage: Usage | None = None) -> ModelResponse:
    """Return a final assistant response: text and no tool calls."""
    return ModelResponse(
        message=Message.assistant(text), usage=usage or Usage(), stop_reason="end_turn"
    )
