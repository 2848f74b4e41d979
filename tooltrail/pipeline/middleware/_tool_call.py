"""The core: ``ToolCallMiddleware``, the registry lookup and dispatch inside every pipeline.

It isolates the body's exceptions (soft texts for tool errors, panics, the tool's own
timeout and refusals) and reads the attempt, fence and heartbeat of the running activity.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from temporalio import activity

from tooltrail.core.results import ToolOutput
from tooltrail.core.text import not_found, panicked
from tooltrail.errors import ToolError
from tooltrail.pipeline.dispatcher import DispatchResult, ToolDispatcher, dispatch_record_of
from tooltrail.pipeline.heartbeats import beat
from tooltrail.pipeline.middleware._core import MiddlewareCall, MiddlewareResult, _soft
from tooltrail.tools import Tool, ToolContext, ToolRegistry
from tooltrail.tools.idempotency import CachedToolError, IdempotencyStoreUnavailable

__all__ = ["ToolCallMiddleware"]

tool_log = logging.getLogger("tooltrail.tool")


class ToolCallMiddleware:
    """The registry core: always the innermost handler of a pipeline (spec §2.3).

    Unlike the layers it does not take a ``next``: it is a ``Next`` itself. It looks up the
    name as it reaches the core (a miss is the soft ``Tool not found`` text, duration 0) and
    hands the call to the ``ToolDispatcher`` (access gate, guardrails, idempotency, body),
    isolating the body's exceptions:

    - ``ToolError``: soft, ``str(err)`` verbatim; any other ``Exception``: soft
      ``tool '{name}' panicked: {message}``, logged at ERROR;
    - the tool's own ``timeout_s``: soft ``Tool '{name}' timed out after {secs}s``;
    - refusals (access denied, guardrail violation, idempotency busy): soft, duration 0.

    ``asyncio.CancelledError`` is never caught; it also tells a sync body (running in a
    thread) to stop through ``ctx.cancelled``. An unavailable idempotency store propagates,
    so Temporal retries the attempt (an idempotent body never runs without a claim).
    """

    def __init__(self, dispatcher: ToolDispatcher | ToolRegistry) -> None:
        """Serve the tools of a dispatcher (or of a registry, with a plain dispatcher).

        Args:
            dispatcher: the worker's dispatcher, or a registry to build one on.
        """
        if isinstance(dispatcher, ToolRegistry):
            dispatcher = ToolDispatcher(dispatcher)
        self.dispatcher = dispatcher
        self.registry = dispatcher.registry

    def __repr__(self) -> str:
        return f"ToolCallMiddleware({sorted(self.registry.names())!r})"

    async def __call__(self, call: MiddlewareCall) -> MiddlewareResult:
        """Run ``call`` against the registry.

        Args:
            call: the call as it reaches the core.

        Returns:
            The body's result, or a soft error; never raises for a tool failure.
        """
        found = self.registry.lookup(call.tool_name)
        if found is None:
            return _soft(call, not_found(call.tool_name, self.registry.names()))
        # A fresh cancel flag per execution: a layer that retries (a timeout retry) must not
        # hand the new body the flag it raised to stop the previous one.
        ctx = replace(call.ctx, _cancel=threading.Event())
        started = time.monotonic()
        output, dispatched = await _dispatch_isolated(self.dispatcher, found, call, ctx)
        refused = dispatched is not None and dispatched.status in _REFUSALS
        return MiddlewareResult(
            output=output.parts if output.parts is not None else (output.text or ""),
            is_error=output.is_error,
            duration_ms=0.0 if refused else (time.monotonic() - started) * 1000.0,
            resolved_tool_name=found.name,
            display_hint=output.display_hint,
            tool_call_id=call.tool_call_id,
            dispatch=None if dispatched is None else dispatched.record,
        )


_REFUSALS = frozenset({"access_denied", "guardrail_violation", "idempotency_busy"})


async def _dispatch_isolated(
    dispatcher: ToolDispatcher, found: Tool, call: MiddlewareCall, ctx: ToolContext
) -> tuple[ToolOutput, DispatchResult | None]:
    """Dispatch with exception isolation; return the output and the dispatch result.

    A dispatch that raised has no result, but its record (when it passed step 1) comes back
    in a result of its own, so the trail has its one dispatch row whatever the outcome.
    """
    scope: asyncio.Timeout | None = None
    heartbeat = _activity_heartbeat()
    try:
        async with asyncio.timeout(found.timeout_s) as scope:
            result = await dispatcher.dispatch(
                call.tool_name,
                call.arguments,
                call_id=call.tool_call_id,
                attempt=_activity_attempt(),
                ctx=ctx,
                heartbeat=heartbeat,
                fence=_activity_fence(),
            )
        if result.output is None:
            return ToolOutput(text=result.text or "", is_error=result.is_error), result
        return result.output, result
    except asyncio.CancelledError:
        ctx._cancel.set()
        raise
    except IdempotencyStoreUnavailable:
        raise
    except CachedToolError as cached:
        # The failure the first call produced, replayed: the same soft text.
        text = cached.message if cached.error_type == "ToolError" else None
        return ToolOutput(
            text=text if text is not None else panicked(found.name, cached.message), is_error=True
        ), _raised(cached)
    except ToolError as err:
        return ToolOutput(text=str(err), is_error=True), _raised(err)
    except Exception as exc:
        if isinstance(exc, TimeoutError) and scope is not None and scope.expired():
            ctx._cancel.set()
            return ToolOutput(
                text=f"Tool '{found.name}' timed out after {int(found.timeout_s or 0)}s",
                is_error=True,
            ), _raised(exc)
        tool_log.error("tool %r panicked", found.name, exc_info=True)
        return ToolOutput(text=panicked(found.name, str(exc)), is_error=True), _raised(exc)


def _raised(exc: BaseException) -> DispatchResult | None:
    """A result carrying the record of a dispatch that raised ``exc`` (``None``: no record)."""
    record = dispatch_record_of(exc)
    if record is None:
        return None
    return DispatchResult(status=record.status, is_error=True, text=record.text, record=record)


def _activity_attempt() -> int:
    # The owner of an idempotency claim is call id + Temporal attempt (1-based).
    try:
        return activity.info().attempt
    except RuntimeError:
        return 1


def _activity_fence() -> str | None:
    # One activity execution: the workflow run, the activity and its Temporal attempt (a
    # recovery retry is a new activity id, a Temporal retry a new attempt).
    try:
        info = activity.info()
    except RuntimeError:
        return None
    execution = f"{info.workflow_run_id}/{info.activity_id}/{info.attempt}"
    return hashlib.sha256(execution.encode()).hexdigest()[:16]


def _activity_heartbeat() -> Callable[[], None] | None:
    try:
        info = activity.info()
    except RuntimeError:
        return None
    if info.is_local:
        return None  # local activities have no heartbeats; their timeout bounds them
    # Heartbeats replace the previous details: send all of the attempt's
    # (tooltrail.pipeline.heartbeats).
    return beat
