"""Calls, results and composition: what a layer gets and returns, and how layers chain.

``MiddlewareCall`` and ``MiddlewareResult`` are one attempt's call and result; a layer is a
``Middleware`` around the ``Next`` handler; ``compose`` chains layers around a core and
``run_pipeline`` runs one attempt through them and stamps the model-issued id.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeAlias, TypeVar, cast

from tooltrail.core.results import Part
from tooltrail.tools import ToolContext

__all__ = ["Middleware", "MiddlewareCall", "MiddlewareResult", "Next", "compose", "run_pipeline"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class MiddlewareCall:
    """One attempt of one call, as a layer sees it.

    A layer that renames the call or changes its input passes
    ``dataclasses.replace(call, tool_name=..., arguments=...)`` to ``next``; every layer
    inside it, and the core, sees the replacement.
    """

    tool_name: str
    """The tool name as it reaches this layer (outer layers may have renamed it)."""
    arguments: dict[str, Any]
    """The tool's input as it reaches this layer."""
    tool_call_id: str
    """The model-issued call id."""
    ctx: ToolContext
    """The context the tool body will receive."""
    registry_names: tuple[str, ...] = ()
    """The registry's names, captured before dispatch; always stored sorted."""

    def __post_init__(self) -> None:
        # Callers may hand over any iterable of names; layers rely on sorted order
        # ("ties keep the first name in sorted order", spec §3.3).
        object.__setattr__(self, "registry_names", tuple(sorted(self.registry_names)))


@dataclass(frozen=True)
class MiddlewareResult:
    """What a layer (or the core) returns for one attempt."""

    output: str | list[Part]
    """Text, or a list of parts for multipart output."""
    is_error: bool
    """True for a soft error."""
    duration_ms: float
    """Wall-clock time of the execution; 0 for refusals."""
    resolved_tool_name: str
    """The name that actually ran (the name as it reached the core)."""
    display_hint: str | None = None
    """A hint for user interfaces."""
    tool_call_id: str = ""
    """Informational only: the engine stamps the model-issued id after the pipeline."""
    dispatch: Any = None
    """The core's dispatch record (a ``DispatchRecord``) for the audit trail, if it ran."""


Next: TypeAlias = Callable[[MiddlewareCall], Awaitable[MiddlewareResult]]
"""The rest of the pipeline, as seen from a layer: the next layer or, innermost, the core."""


class Middleware(Protocol):
    """A pipeline layer: any async callable ``(call, next) -> MiddlewareResult``."""

    async def __call__(self, call: MiddlewareCall, next: Next, /) -> MiddlewareResult:
        """Handle ``call``, usually by awaiting ``next(call)`` (or a replaced call).

        Args:
            call: the call as it reaches this layer.
            next: the rest of the pipeline.

        Returns:
            The attempt's result.
        """
        ...


def _bind(layer: Middleware, call_next: Next) -> Next:
    async def run(call: MiddlewareCall) -> MiddlewareResult:
        return await layer(call, call_next)

    return run


def compose(layers: Sequence[Middleware], core: Next) -> Next:
    """Chain layers around a core; ``layers[0]`` is the outermost.

    Args:
        layers: the layers, in registration order.
        core: the innermost handler, normally a ``ToolCallMiddleware``.

    Returns:
        A handler that runs ``layers[0]``, which calls ``layers[1]``, ..., then ``core``.
    """
    handler = core
    for layer in reversed(layers):
        handler = _bind(layer, handler)
    return handler


async def run_pipeline(
    layers: Sequence[Middleware], core: Next, call: MiddlewareCall
) -> MiddlewareResult:
    """Run one attempt through the layers and the core, then stamp the ids (spec §13).

    Whatever ``tool_call_id`` a layer returned (stale, empty, invented) is replaced by
    ``call.tool_call_id``, the model-issued id. An empty ``resolved_tool_name`` is filled
    with the requested name, so the result always names a tool.

    Args:
        layers: the layers, first = outermost.
        core: the innermost handler.
        call: the call as the engine issues it.

    Returns:
        The result, with the model-issued id.
    """
    result = await compose(layers, core)(call)
    return replace(
        result,
        tool_call_id=call.tool_call_id,
        resolved_tool_name=result.resolved_tool_name or call.tool_name,
    )


async def _resolve(value: _T | Awaitable[_T]) -> _T:
    """Await ``value`` when a sync-or-async callback returned an awaitable."""
    if inspect.isawaitable(value):
        return cast(_T, await value)
    return value


def _soft(call: MiddlewareCall, text: str, duration_ms: float = 0.0) -> MiddlewareResult:
    """A soft error produced by a layer on behalf of ``call``."""
    return MiddlewareResult(
        output=text,
        is_error=True,
        duration_ms=duration_ms,
        resolved_tool_name=call.tool_name,
        tool_call_id=call.tool_call_id,
    )
