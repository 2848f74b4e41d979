"""``SafetyShieldMiddleware``: ``ShieldCheck`` judges screen a call's input and output.

A block is the soft ``SHIELD_TEXT`` with the judge's reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeAlias

from tooltrail.pipeline.middleware._core import (
    MiddlewareCall,
    MiddlewareResult,
    Next,
    _resolve,
    _soft,
)

__all__ = ["SHIELD_TEXT", "SafetyShieldMiddleware", "ShieldCheck"]

log = logging.getLogger("tooltrail.middleware")

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
