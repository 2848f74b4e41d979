"""``PermissionMiddleware``: a policy decides per call whether it runs, changed or not.

The decisions are ``PermissionAllow``, ``PermissionModify``, ``PermissionDeny`` and
``PermissionAsk`` (settled by a ``PermissionResolver``, or denied without one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from tooltrail.pipeline.middleware._core import (
    MiddlewareCall,
    MiddlewareResult,
    Next,
    _resolve,
    _soft,
)

__all__ = [
    "PermissionAllow",
    "PermissionAsk",
    "PermissionDecision",
    "PermissionDeny",
    "PermissionMiddleware",
    "PermissionModify",
    "PermissionPolicy",
    "PermissionResolver",
]


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
