"""The middleware pipeline: layers that wrap the execution of one attempt (spec §12).

A layer is any async callable ``layer(call, next) -> MiddlewareResult``. It may inspect or
replace the call before passing it on (a renamed or re-argued call is a
``dataclasses.replace`` of the one it got), answer without calling ``next`` at all (a
refusal), or rewrite the result on the way back. ``compose`` chains layers around a core,
first registered = outermost, so the observable order is the registration order.

These layers run worker-side, inside the tool activity, around ``ToolCallMiddleware`` (the
registry core: lookup, validation, exception isolation, timing). They keep no state between
calls: session-scoped state such as a memoize cache must not live in worker memory (spec §0
rule 5), which is why ``MemoizingMiddleware`` belongs to workflow code and is not here.

Ids: a layer's results carry ``tool_call_id`` only as a courtesy. The engine overwrites it
with the model-issued id after the pipeline returns (spec §13); ``run_pipeline`` does exactly
that, so no layer can break the call/result pairing.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeAlias, TypeVar, cast

from temporalio import activity

from tooltrail.core.results import Part, TextPart, ToolOutput
from tooltrail.core.similarity import best_match
from tooltrail.core.text import not_found, panicked
from tooltrail.errors import ToolError
from tooltrail.pipeline.dispatcher import DispatchResult, ToolDispatcher, dispatch_record_of
from tooltrail.pipeline.heartbeats import beat
from tooltrail.tools import (
    Tool,
    ToolContext,
    ToolRegistry,
)
from tooltrail.tools.idempotency import CachedToolError, IdempotencyStoreUnavailable

__all__ = [
    "SHIELD_TEXT",
    "TRUNCATION_MARKER",
    "Middleware",
    "MiddlewareCall",
    "MiddlewareResult",
    "Next",
    "OutputLimitMiddleware",
    "PermissionAllow",
    "PermissionAsk",
    "PermissionDecision",
    "PermissionDeny",
    "PermissionMiddleware",
    "PermissionModify",
    "PermissionPolicy",
    "PermissionResolver",
    "RedactingMiddleware",
    "SafetyShieldMiddleware",
    "ShieldCheck",
    "TimeoutMiddleware",
    "ToolCallMiddleware",
    "UnknownToolMiddleware",
    "VerifyCheck",
    "VerifyMiddleware",
    "compose",
    "run_pipeline",
]

log = logging.getLogger("tooltrail.middleware")
tool_log = logging.getLogger("tooltrail.tool")

_T = TypeVar("_T")


# -- calls, results and composition ----------------------------------------------------------


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


# -- the core ------------------------------------------------------------------------------


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


# -- TimeoutMiddleware ---------------------------------------------------------------------


class TimeoutMiddleware:
    """Bound the time the rest of the pipeline may take.

    On timeout the inner call is cancelled and the result is the soft text
    ``Tool '{name}' timed out after {secs}s``, where ``{secs}`` is the whole seconds of the
    deadline that expired, and ``duration_ms`` is that deadline. With
    ``retry_on_timeout=True`` a timed-out call runs again, up to ``max_retries`` times, and
    each retry gets twice the previous deadline.
    """

    DEFAULT_SECONDS = 120.0
    """The default deadline: 2 minutes."""

    def __init__(
        self,
        seconds: float | None = DEFAULT_SECONDS,
        retry_on_timeout: bool = False,
        max_retries: int = 0,
    ) -> None:
        """Configure the deadline.

        Args:
            seconds: the first deadline in seconds; ``None`` means no limit.
            retry_on_timeout: whether a timed-out call runs again.
            max_retries: how many times it may run again (only with ``retry_on_timeout``).

        Raises:
            ValueError: ``seconds`` is negative or not a number, or ``max_retries`` is
                negative.
        """
        if seconds is not None and (math.isnan(seconds) or seconds < 0):
            raise ValueError(f"seconds must be None or a non-negative number, got {seconds!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        self.seconds = seconds
        self.retry_on_timeout = retry_on_timeout
        self.max_retries = max_retries

    @classmethod
    def none(cls) -> TimeoutMiddleware:
        """Return a layer with no time limit (it passes every call through)."""
        return cls(None)

    @classmethod
    def from_secs(cls, seconds: float) -> TimeoutMiddleware:
        """Return a layer with a deadline of ``seconds`` and no retries."""
        return cls(seconds)

    def __repr__(self) -> str:
        return (
            f"TimeoutMiddleware(seconds={self.seconds!r}, "
            f"retry_on_timeout={self.retry_on_timeout!r}, max_retries={self.max_retries!r})"
        )

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline under the deadline.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result, or the soft timeout text.
        """
        if self.seconds is None:
            return await call_next(call)
        deadline = self.seconds
        retries = self.max_retries if self.retry_on_timeout else 0
        for retry in range(retries + 1):
            deadline = self.seconds * (2**retry)
            try:
                async with asyncio.timeout(deadline) as scope:
                    return await call_next(call)
            except TimeoutError:
                # A TimeoutError raised by an inner layer is not ours to reinterpret.
                if not scope.expired():
                    raise
        return _soft(
            call, f"Tool '{call.tool_name}' timed out after {int(deadline)}s", deadline * 1000.0
        )


# -- PermissionMiddleware ------------------------------------------------------------------


@dataclass(frozen=True)
class PermissionAllow:
    """Let the call through unchanged."""


@dataclass(frozen=True)
class PermissionModify:
    """Let the call through with a replaced input."""

    modified_input: dict[str, Any]
    """The input the tool runs with instead."""

    def __post_init__(self) -> None:
        if not isinstance(self.modified_input, Mapping):
            raise TypeError(
                "PermissionModify(modified_input=...) needs a mapping of arguments, got "
                f"{type(self.modified_input).__name__!r}"
            )


@dataclass(frozen=True)
class PermissionDeny:
    """Refuse the call: soft ``Permission {reason} for tool '{name}'``."""

    reason: str
    """Why; it appears verbatim in the text the model reads."""


@dataclass(frozen=True)
class PermissionAsk:
    """Ask someone first; without a resolver the call is denied."""

    prompt: str
    """The question for the resolver (or, without one, part of the denial text)."""


PermissionDecision: TypeAlias = PermissionAllow | PermissionModify | PermissionDeny | PermissionAsk
"""What a permission policy returns."""

PermissionPolicy: TypeAlias = Callable[
    [MiddlewareCall], PermissionDecision | Awaitable[PermissionDecision]
]
"""A sync or async function of the call that decides."""

PermissionResolver: TypeAlias = Callable[[str, MiddlewareCall], bool | Awaitable[bool]]
"""A sync or async function ``(prompt, call) -> approved`` that settles a ``PermissionAsk``."""


class PermissionMiddleware:
    """Decide per call whether it may run.

    - ``PermissionAllow()`` passes the call on.
    - ``PermissionModify(modified_input)`` passes it on with the replaced input.
    - ``PermissionDeny(reason)`` answers soft ``Permission {reason} for tool '{name}'``,
      duration 0, without running anything.
    - ``PermissionAsk(prompt)`` without a resolver is denied with the reason
      ``permission required: {prompt}``. With a resolver, approval passes the call on and a
      refusal is denied with ``denied by user``; if the resolver itself is cancelled (not the
      attempt) the reason is ``cancelled while awaiting approval``. Cancellation of the
      attempt always propagates.

    Exceptions raised by the policy or the resolver propagate (they are bugs, not decisions).
    """

    def __init__(
        self, policy: PermissionPolicy, resolver: PermissionResolver | None = None
    ) -> None:
        """Wire the policy.

        Args:
            policy: decides each call; sync or async.
            resolver: settles ``PermissionAsk`` decisions; sync or async. ``None`` means the
                session is not interactive, so every ask is denied.
        """
        self.policy = policy
        self.resolver = resolver

    @classmethod
    def deny_all(cls) -> PermissionMiddleware:
        """Return a layer that denies every call with the reason ``blocked by policy``."""

        def deny(_call: MiddlewareCall) -> PermissionDecision:
            return PermissionDeny("blocked by policy")

        return cls(deny)

    def __repr__(self) -> str:
        return f"PermissionMiddleware(policy={self.policy!r}, resolver={self.resolver!r})"

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Consult the policy, then run the call or refuse it.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result, or the soft denial.

        Raises:
            TypeError: the policy returned something other than a permission decision.
        """
        decision = await _resolve(self.policy(call))
        if isinstance(decision, PermissionAllow):
            return await call_next(call)
        if isinstance(decision, PermissionModify):
            return await call_next(replace(call, arguments=dict(decision.modified_input)))
        if isinstance(decision, PermissionDeny):
            return self._deny(call, decision.reason)
        if isinstance(decision, PermissionAsk):
            return await self._ask(call, call_next, decision.prompt)
        raise TypeError(
            f"permission policy {self.policy!r} returned {decision!r}; expected "
            "PermissionAllow, PermissionModify, PermissionDeny or PermissionAsk"
        )

    async def _ask(self, call: MiddlewareCall, call_next: Next, prompt: str) -> MiddlewareResult:
        if self.resolver is None:
            return self._deny(call, f"permission required: {prompt}")
        try:
            approved = await _resolve(self.resolver(prompt, call))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the attempt itself is being cancelled: that always wins
            return self._deny(call, "cancelled while awaiting approval")
        if not approved:
            return self._deny(call, "denied by user")
        return await call_next(call)

    @staticmethod
    def _deny(call: MiddlewareCall, reason: str) -> MiddlewareResult:
        return _soft(call, f"Permission {reason} for tool '{call.tool_name}'")


# -- OutputLimitMiddleware -----------------------------------------------------------------

TRUNCATION_MARKER = "\n[truncated]"
"""Appended to output cut by ``OutputLimitMiddleware``; it counts inside the budget."""


def _limit_text(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    keep = max(0, budget - len(TRUNCATION_MARKER))
    # With a budget smaller than the marker, even the marker is cut: the budget is a
    # hard ceiling on what the model reads.
    return (text[:keep] + TRUNCATION_MARKER)[:budget]


def _limit_parts(parts: list[Part], budget: int) -> list[Part]:
    total = sum(len(part.text) for part in parts if isinstance(part, TextPart))
    if total <= budget:
        return parts
    remaining = max(0, budget - len(TRUNCATION_MARKER))
    out: list[Part] = []
    cut = False
    for part in parts:
        if not isinstance(part, TextPart):
            out.append(part)  # images carry no characters: the budget does not touch them
        elif cut:
            continue  # text after the cut is dropped
        elif len(part.text) < remaining:
            out.append(part)
            remaining -= len(part.text)
        else:
            # total > budget guarantees the cut lands on some text part. A budget smaller
            # than the marker leaves remaining == 0 and cuts the marker itself.
            piece = part.text[:remaining] + TRUNCATION_MARKER
            out.append(TextPart(piece[:budget]))
            cut = True
    return out


class OutputLimitMiddleware:
    r"""Cap the characters of output the model reads.

    Text longer than ``max_chars`` keeps its head and ends with ``\n[truncated]``; the
    marker counts inside the budget, so the result is exactly ``max_chars`` characters.
    ``max_chars=0`` disables the layer. Characters are code points (``len``), not bytes.

    Multipart output (**decision (ours)**): the budget is shared by the text parts, in
    order, counting their characters only (not the newlines ``render_text`` puts between
    parts). The text part where the budget runs out is cut and gets the marker; later text
    parts are dropped; image parts are kept as they are.
    """

    def __init__(self, max_chars: int) -> None:
        """Set the budget.

        Args:
            max_chars: the most characters of output; 0 disables the limit.

        Raises:
            ValueError: ``max_chars`` is negative.
        """
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0 (0 disables the limit), got {max_chars}")
        self.max_chars = max_chars

    def __repr__(self) -> str:
        return f"OutputLimitMiddleware({self.max_chars!r})"

    def limit(self, output: str | list[Part]) -> str | list[Part]:
        """Apply the budget to an output (text or multipart).

        Args:
            output: the output to cap.

        Returns:
            The output, cut to the budget when it exceeds it.
        """
        if self.max_chars == 0:
            return output
        if isinstance(output, str):
            return _limit_text(output, self.max_chars)
        return _limit_parts(output, self.max_chars)

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline and cap its output.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result with its output capped; errors are capped too.
        """
        result = await call_next(call)
        limited = self.limit(result.output)
        return result if limited is result.output else replace(result, output=limited)


# -- VerifyMiddleware ----------------------------------------------------------------------

VerifyCheck: TypeAlias = Callable[
    [MiddlewareCall, MiddlewareResult], tuple[bool, str] | Awaitable[tuple[bool, str]]
]
"""A sync or async function ``(call, result) -> (passed, detail)``."""


class VerifyMiddleware:
    r"""Check every result and tell the model what the check found.

    Text output gets ``\n\n[verify] passed: {detail}`` or ``\n\n[verify] failed: {detail}``
    appended; multipart output gets an extra text part ``[verify] passed: {detail}`` (or
    ``failed``). The layer never changes ``is_error``. A check that raises is reported as
    ``failed: check raised {Type}: {message}`` (and logged) rather than failing the
    attempt, because the tool has already run and must not run again for a checker's bug.
    """

    def __init__(self, check: VerifyCheck) -> None:
        """Wire the check.

        Args:
            check: ``(call, result) -> (passed, detail)``, sync or async.
        """
        self.check = check

    def __repr__(self) -> str:
        return f"VerifyMiddleware({self.check!r})"

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline, then verify and annotate the result.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result with the verdict appended.
        """
        result = await call_next(call)
        try:
            passed, detail = await _resolve(self.check(call, result))
        except Exception as exc:
            log.error("verify check %r raised", self.check, exc_info=True)
            passed, detail = False, f"check raised {type(exc).__name__}: {exc}"
        verdict = f"[verify] {'passed' if passed else 'failed'}: {detail}"
        if isinstance(result.output, str):
            return replace(result, output=f"{result.output}\n\n{verdict}")
        return replace(result, output=[*result.output, TextPart(verdict)])


# -- SafetyShieldMiddleware ----------------------------------------------------------------

SHIELD_TEXT = "blocked by safety shield"
"""What every shield block's text contains (spec §12)."""

ShieldCheck: TypeAlias = Callable[..., str | Awaitable[str | None] | None]
"""A sync or async judge returning why to block, or ``None`` to let the call through."""


class SafetyShieldMiddleware:
    """Screen a call's input before the tool, and optionally its output after it (spec §12).

    A block is a soft result ``blocked by safety shield: <reason>`` (duration 0 before the
    tool; the tool's duration after it). It is the tool's result, not a refusal before it:
    it counts as a failure for the tool's circuit breaker, and recovery sees it like any
    failure. A judge that raises blocks the call with ``check error (<ExceptionType>)``.
    Recommended placement: inside any renaming layer and outside memoize, so a cached result
    is screened too.
    """

    def __init__(
        self,
        check_input: ShieldCheck | None = None,
        *,
        check_output: ShieldCheck | None = None,
    ) -> None:
        """Configure the shield.

        Args:
            check_input: ``(call) -> reason | None``, judged before the rest of the pipeline.
            check_output: ``(call, result) -> reason | None``, judged on a successful result.
        """
        self.check_input = check_input
        self.check_output = check_output

    def __repr__(self) -> str:
        return f"SafetyShieldMiddleware({self.check_input!r}, check_output={self.check_output!r})"

    @staticmethod
    async def _judge(check: ShieldCheck, *args: Any) -> str | None:
        try:
            reason = await _resolve(check(*args))
        except Exception as exc:
            log.error("safety shield check %r raised", check, exc_info=True)
            return f"check error ({type(exc).__name__})"
        return None if reason is None else str(reason)

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Judge the input, run the rest of the pipeline, judge the output.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result, or the block.
        """
        if self.check_input is not None:
            reason = await self._judge(self.check_input, call)
            if reason is not None:
                return _soft(call, f"{SHIELD_TEXT}: {reason}")
        result = await call_next(call)
        if self.check_output is not None and not result.is_error:
            reason = await self._judge(self.check_output, call, result)
            if reason is not None:
                return replace(result, output=f"{SHIELD_TEXT}: {reason}", is_error=True)
        return result


# -- RedactingMiddleware -------------------------------------------------------------------

# Markers already in the text are never matched again, so a broad pattern cannot chew up
# what an earlier pattern inserted.
_MARKER = re.compile(r"(\[REDACTED:[^\]\n]*\])")


class RedactingMiddleware:
    """Replace sensitive matches in the output with ``[REDACTED:<kind>]``.

    Patterns apply in mapping order, each to the text left outside earlier markers; empty
    matches are ignored. Multipart output is redacted part by part (text parts only).
    ``redact_text`` and ``redact_value`` expose the same rules so the engine can apply them
    to what the audit trail stores.
    """

    def __init__(self, patterns: Mapping[str, str | re.Pattern[str]]) -> None:
        r"""Compile the patterns.

        Args:
            patterns: kind -> regular expression (text or compiled), e.g.
                ``{"email": r"[\w.+-]+@[\w-]+\.[\w.]+"}``.

        Raises:
            re.error: a pattern does not compile.
        """
        self.patterns: dict[str, re.Pattern[str]] = {
            kind: re.compile(pattern) if isinstance(pattern, str) else pattern
            for kind, pattern in patterns.items()
        }

    def __repr__(self) -> str:
        return f"RedactingMiddleware({list(self.patterns)!r})"

    def redact_text(self, text: str) -> str:
        """Return ``text`` with every match replaced by ``[REDACTED:<kind>]``.

        Args:
            text: any text.

        Returns:
            The redacted text.
        """
        for kind, pattern in self.patterns.items():
            marker = f"[REDACTED:{kind}]"

            def sub(match: re.Match[str], marker: str = marker) -> str:
                return marker if match.group(0) else ""

            pieces = _MARKER.split(text)
            # split() with a capturing group alternates: text, marker, text, ...
            text = "".join(
                pattern.sub(sub, piece) if index % 2 == 0 else piece
                for index, piece in enumerate(pieces)
            )
        return text

    def redact_output(self, output: str | list[Part]) -> str | list[Part]:
        """Redact a text or multipart output.

        Args:
            output: the output.

        Returns:
            The output with its text redacted; image parts are unchanged.
        """
        if isinstance(output, str):
            return self.redact_text(output)
        return [
            TextPart(self.redact_text(part.text)) if isinstance(part, TextPart) else part
            for part in output
        ]

    def redact_value(self, value: Any) -> Any:
        """Redact every string inside JSON-like data (e.g. a call's input for the audit).

        Args:
            value: a string, or dicts, lists and tuples of them; other values pass through.

        Returns:
            A redacted copy; mapping keys are kept as they are.
        """
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, Mapping):
            return {key: self.redact_value(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_value(item) for item in value]
        return value

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline and redact its output.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result with its output redacted.
        """
        result = await call_next(call)
        return replace(result, output=self.redact_output(result.output))


# -- UnknownToolMiddleware -----------------------------------------------------------------


class UnknownToolMiddleware:
    """Append ``. Did you mean '{best}'?`` to "tool not found" results (spec §3.3).

    It acts only when the result is a soft error with text output whose lowercase form
    contains both ``not found`` and ``tool``. The name compared is the call's name as it
    stands after the inner layers ran (the result's ``resolved_tool_name``, which the core
    sets to the name that reached it), against the registry names captured before dispatch,
    in sorted order, using ``tooltrail.core.similarity.best_match``. **Decision (ours):** a name
    that is itself registered gets no suggestion (suggesting the same name helps nobody,
    e.g. for ``tool 'read' panicked: file not found``).
    """

    DEFAULT_THRESHOLD = 0.4
    """The lowest similarity that yields a suggestion by default."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD) -> None:
        """Set the threshold.

        Args:
            threshold: the lowest acceptable similarity, clamped to ``[0, 1]``.

        Raises:
            ValueError: ``threshold`` is NaN.
        """
        if math.isnan(threshold):
            raise ValueError("threshold must be a number in [0, 1], got NaN")
        self.threshold = min(1.0, max(0.0, float(threshold)))

    @classmethod
    def with_threshold(cls, threshold: float) -> UnknownToolMiddleware:
        """Return a layer with ``threshold`` clamped to ``[0, 1]``.

        Works on the class and on an instance alike.
        """
        return cls(threshold)

    def __repr__(self) -> str:
        return f"UnknownToolMiddleware(threshold={self.threshold!r})"

    def suggest(self, name: str, registry_names: Sequence[str]) -> str | None:
        """Return the registered name to suggest for ``name``, or ``None``.

        Args:
            name: the name that was not found.
            registry_names: the registry's names.

        Returns:
            The best match at or above the threshold.
        """
        if name in registry_names:
            return None
        return best_match(name, registry_names, self.threshold)

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline and add a suggestion to a not-found result.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result, possibly with ``. Did you mean '{best}'?`` appended.
        """
        result = await call_next(call)
        if not result.is_error or not isinstance(result.output, str):
            return result
        lowered = result.output.lower()
        if "not found" not in lowered or "tool" not in lowered:
            return result
        best = self.suggest(result.resolved_tool_name or call.tool_name, call.registry_names)
        if best is None:
            return result
        return replace(result, output=f"{result.output}. Did you mean '{best}'?")
