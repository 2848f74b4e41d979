"""The ``@tool`` decorator, and ``to_output`` for what a tool body returned.

``to_output`` turns text, a ``ToolOutput``, a pydantic model or JSON data into the
``ToolOutput`` the pipeline hands on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, overload

from pydantic import BaseModel

from tooltrail.core.results import ToolOutput
from tooltrail.tools._tool import Extra, Tool
from tooltrail.tools.guards import Guard, InputGuard
from tooltrail.tools.idempotency import IdempotencyDeclaration

__all__ = ["to_output", "tool"]


def to_output(value: Any) -> ToolOutput:
    """Turn what a tool returned into a ``ToolOutput``.

    Raises:
        TypeError: the value is not text, a ``ToolOutput``, a pydantic model or JSON data.
    """
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(text=value)
    if isinstance(value, BaseModel):
        return ToolOutput(text=value.model_dump_json())
    try:
        return ToolOutput(text=json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"returned a value of type {type(value).__name__!r}, which is not JSON-serialisable"
        ) from exc


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
    resource_key: Callable[[dict[str, Any]], str | None] | None = None,
    idempotent: IdempotencyDeclaration = None,
    guard: InputGuard | Guard | None = None,
    extra: Extra | None = None,
    timeout_s: float | None = None,
    retry_on_interrupt: bool = True,
    local: bool = False,
    own_loop: bool = True,
    loop_thresholds: int | None = None,
    primary_param: str | None = None,
    loop_suggestion: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
    resource_key: Callable[[dict[str, Any]], str | None] | None = None,
    idempotent: IdempotencyDeclaration = None,
    guard: InputGuard | Guard | None = None,
    extra: Extra | None = None,
    timeout_s: float | None = None,
    retry_on_interrupt: bool = True,
    local: bool = False,
    own_loop: bool = True,
    loop_thresholds: int | None = None,
    primary_param: str | None = None,
    loop_suggestion: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: ``@tool`` or ``@tool(name=..., ...)`` on a ``def`` or ``async def``.

    Args:
        fn: the function, when used bare.
        name: the tool name (default: the function name).
        description: the description (default: the docstring's first paragraph).
        concurrent_safe: whether calls may run in parallel, or a function of the arguments.
        resource_key: for safe calls, a function of the arguments naming the resource
            touched; calls with equal keys never run together.
        idempotent: ``True``, ``False`` or an ``Idempotency`` policy (an
            ``IdempotencyDeclaration``); ``None`` (the default) declares nothing, so the tool
            inherits ``@tool_defaults`` of its class, then ``TOOLTRAIL_DEFAULTS`` of its
            module, else it is not idempotent.
        guard: an ``InputGuard`` for every string argument; ``None`` inherits like
            ``idempotent``. The nearest declaration replaces the others.
        extra: what undeclared arguments do: ``"ignore"`` (dropped and reported as
            ``Snapshot.ignored_arguments``; the default) or ``"forbid"`` (a violation).
        timeout_s: the longest one attempt may run.
        retry_on_interrupt: whether an attempt interrupted by a lost worker runs again.
        local: run each attempt as a Temporal *local activity*: in the worker that runs the
            turn, without a server round trip of its own, and without the attempt's input
            in the workflow history. For fast (milliseconds), side-effect-free or
            idempotent tools. The trade-off: no heartbeats (only the timeout bounds a hung
            body, and cancellation is best-effort), and an attempt whose worker is lost
            before the turn's next workflow task completes runs again, so the body may run
            more than once. The pipeline, the audit trail and recovery are the same.
        own_loop: for an ``async def`` tool: run each body, inside a worker, on an event
            loop of its own (the default), so a blocking call in it cannot stop the
            worker's heartbeats (Temporal would run it again) or its other turns. ``False``
            runs it on the worker's loop, for a body that shares loop-bound objects (an
            ``asyncio.Event`` or a client created on that loop) with the host.
        loop_thresholds: this tool's loop threshold (pipeline spec §10.1, the signature's
            ``tool_thresholds()``): how many identical operations of this tool make a
            pattern; ``None`` uses ``RunConfig.detection.loop_threshold``. The stop
            threshold stays the run's.
        primary_param: the parameter whose value identifies an operation for loop
            detection (§10.2, the signature's ``extract_primary_param``); a string value is
            used as is, any other value as its canonical JSON. ``None`` (or a call without
            it) uses the canonical JSON of the whole input.
        loop_suggestion: the end of the host's loop warning for this tool's patterns
            (default ``Consider a different approach or tool.``).
    """

    def wrap(func: Callable[..., Any]) -> Tool:
        return Tool(
            func,
            name=name,
            description=description,
            concurrent_safe=concurrent_safe,
            resource_key=resource_key,
            idempotent=idempotent,
            guard=guard,
            extra=extra,
            timeout_s=timeout_s,
            retry_on_interrupt=retry_on_interrupt,
            own_loop=own_loop,
            local=local,
            loop_thresholds=loop_thresholds,
            primary_param=primary_param,
            loop_suggestion=loop_suggestion,
        )

    return wrap if fn is None else wrap(fn)
