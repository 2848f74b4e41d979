"""``TimeoutMiddleware``: a deadline on the rest of the pipeline, with optional retries."""

from __future__ import annotations

import asyncio
import math

from tooltrail.pipeline.middleware._core import MiddlewareCall, MiddlewareResult, Next, _soft

__all__ = ["TimeoutMiddleware"]


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
