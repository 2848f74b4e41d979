"""The errors of idempotent calls: a failed key function, a cached failure, an unreachable store.

``IdempotencyKeyError`` and ``CachedToolError`` are not retryable;
``IdempotencyStoreUnavailable`` is (the call fails closed and Temporal retries it).
"""

from __future__ import annotations

from tooltrail.errors import TooltrailError

__all__ = ["CachedToolError", "IdempotencyKeyError", "IdempotencyStoreUnavailable"]


class IdempotencyKeyError(TooltrailError):
    """Raised when an explicit key function raises or returns anything but a non-empty ``str``.

    The body does not run and the store is untouched; retrying cannot help (not retryable).
    """


class CachedToolError(TooltrailError):
    """Raised when a call hits a cached failure (``Idempotency(cache_failures=True)``).

    The body does not run; the error repeats the original failure's type name and message.
    """

    def __init__(self, error_type: str, message: str, source_call_id: str | None = None) -> None:
        """Create the error.

        Args:
            error_type: the class name of the exception the original body raised.
            message: ``str()`` of that exception.
            source_call_id: the call whose body failed.
        """
        super().__init__(error_type, message, source_call_id)
        self.error_type = error_type
        self.message = message
        self.source_call_id = source_call_id

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}" if self.message else self.error_type


class IdempotencyStoreUnavailable(TooltrailError):
    """Raised when the idempotency store cannot be read or written (retryable).

    An idempotent body never runs without a claim: the call fails closed and Temporal retries
    the activity.
    """
