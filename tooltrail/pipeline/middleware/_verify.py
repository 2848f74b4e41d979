"""``VerifyMiddleware``: a ``VerifyCheck`` judges every result and the model reads its verdict."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeAlias

from tooltrail.core.results import TextPart
from tooltrail.pipeline.middleware._core import MiddlewareCall, MiddlewareResult, Next, _resolve

__all__ = ["VerifyCheck", "VerifyMiddleware"]

log = logging.getLogger("tooltrail.middleware")

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
