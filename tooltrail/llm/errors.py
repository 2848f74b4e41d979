"""Model-call failures, and how each one becomes a Temporal retry decision.

The tree::

    ModelError (TooltrailError)      base of every failure a model client raises
    ├── ModelHTTPError               the provider answered with an HTTP error status
    ├── ModelConnectionError         no answer: connect failure, timeout, dropped connection
    ├── ModelRequestError            the SDK refused to send the request (a bad setting)
    ├── ModelResponseError           a success status whose body is not the expected shape
    └── ScriptExhaustedError         a ``ScriptedModel`` was asked for more than its script

The provider clients run on the official SDKs (``openai``, ``anthropic``) with the SDKs' own
retries off (``max_retries=0``): Temporal's retry policy is the only retry loop, so a call
is never retried twice over. Each client maps the SDK's exceptions onto this tree
(``APIStatusError`` to ``ModelHTTPError``, ``APIConnectionError`` and ``APITimeoutError`` to
``ModelConnectionError``), and ``to_application_error`` is the one place that turns these
failures into that policy's input, at the activity boundary:

- 408, 409, 429 and 5xx, and every connection failure, are retryable (``ModelUnavailable``);
  a ``Retry-After`` / ``retry-after-ms`` answer becomes the next retry's delay, overriding
  the policy's backoff for that one retry;
- every other 4xx is final (``ModelRequestRejected``): the same request would fail again,
  and so would a request the SDK refused to send;
- a malformed success body is final (``ModelResponseInvalid``): the server does not speak
  the protocol the client was configured for.

An answer cut off by ``max_tokens`` while it asked for tools (or before it said anything)
fails the model activity for good with ``ModelOutputTruncated`` (raised by the activity,
not a client): its tool calls may be incomplete, so they are never run.

Pure module (no I/O, no HTTP client at import): workflow code imports ``MODEL_RETRY_POLICY``.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from temporalio.exceptions import ApplicationError

from tooltrail.core.messages import (
    MODEL_OUTPUT_TRUNCATED,
    MODEL_REQUEST_REJECTED,
    MODEL_RESPONSE_INVALID,
    MODEL_RETRY_POLICY,
    MODEL_SCRIPT_EXHAUSTED,
    MODEL_UNAVAILABLE,
)
from tooltrail.errors import TooltrailError

__all__ = [
    "MAX_RETRY_AFTER_S",
    "MODEL_OUTPUT_TRUNCATED",
    "MODEL_REQUEST_REJECTED",
    "MODEL_RESPONSE_INVALID",
    "MODEL_RETRY_POLICY",
    "MODEL_SCRIPT_EXHAUSTED",
    "MODEL_UNAVAILABLE",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelRequestError",
    "ModelResponseError",
    "ScriptExhaustedError",
    "classify",
    "parse_retry_after",
    "to_application_error",
]

MAX_RETRY_AFTER_S = 300.0
"""Longest server-requested delay honoured; a longer one is cut to this, so one answer
cannot park a turn for hours (the next answer may ask again)."""


_RETRYABLE_STATUSES = frozenset({408, 409, 429})


class ModelError(TooltrailError):
    """Base class of the failures model clients raise."""


class ModelHTTPError(ModelError):
    """Raised when the provider answers with an HTTP error status (4xx or 5xx)."""

    def __init__(
        self,
        status: int,
        message: str,
        retry_after_s: float | None = None,
        *,
        retryable: bool | None = None,
        request_id: str | None = None,
    ) -> None:
        """Create the error.

        Args:
            status: the HTTP status code.
            message: the provider's error message (or the start of the body).
            retry_after_s: the delay the provider asked for, from ``Retry-After`` or
                ``retry-after-ms``.
            retryable: the provider's own verdict (an ``x-should-retry`` header); ``None``
                decides by status with ``classify``.
            request_id: the provider's request id, for support requests.
        """
        super().__init__(f"model HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.retryable = classify(status) if retryable is None else retryable
        self.request_id = request_id


class ModelConnectionError(ModelError):
    """Raised when no HTTP answer arrived: connect failure, timeout or dropped connection.

    Always retryable; the SDK's ``APIConnectionError`` (or ``APITimeoutError``) is the
    ``__cause__``.
    """


class ModelRequestError(ModelError):
    """Raised when the SDK refuses to send a request, before any HTTP exchange.

    For example a ``max_tokens`` the Anthropic SDK deems too long for a request that is not
    streamed. Final: the same request would be refused again.
    """


class ModelResponseError(ModelError):
    """Raised when a success response is not valid JSON of the provider's expected shape."""


class ScriptExhaustedError(ModelError):
    """Raised by ``ScriptedModel.complete`` when every scripted response was used."""


def classify(status: int) -> bool:
    """Return whether a request that got HTTP ``status`` may succeed if sent again.

    408 (timeout), 409 (conflict, e.g. a lock), 429 (rate limit) and every 5xx (including
    Anthropic's 529 "overloaded") are retryable; everything else is not.
    """
    return status in _RETRYABLE_STATUSES or status >= 500


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Return the delay, in seconds, a response asks for before the next request.

    ``retry-after-ms`` (milliseconds, sent by OpenAI) wins over ``Retry-After``, which is
    either seconds or an HTTP-date. Header names match case-insensitively; negative delays
    and dates in the past give 0.

    Args:
        headers: the response headers (a plain mapping or ``httpx.Headers``).
        now: the current time for HTTP-dates (default: the clock).

    Returns:
        The delay, or ``None`` when neither header is present and valid.
    """
    lowered = {key.lower(): value.strip() for key, value in headers.items()}
    if "retry-after-ms" in lowered:
        millis = _seconds(lowered["retry-after-ms"])
        if millis is not None:
            return millis / 1000.0
    value = lowered.get("retry-after")
    if not value:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is read as UTC
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _retry_delay(seconds: float | None) -> timedelta | None:
    if seconds is None:
        return None
    return timedelta(seconds=min(seconds, MAX_RETRY_AFTER_S))


def to_application_error(exc: BaseException) -> ApplicationError:
    """Map a model-call failure to the ``ApplicationError`` the activity raises.

    Args:
        exc: a ``ModelError``, an ``httpx`` or ``httpx2`` ``TransportError``, or anything
            else (reported as retryable under its class name, as Temporal would do with it
            unmapped).

    Returns:
        A retryable ``ModelUnavailable`` (with ``next_retry_delay`` when the provider asked
        for one), or a non-retryable ``ModelRequestRejected``, ``ModelResponseInvalid`` or
        ``ModelScriptExhausted``. Its details hold ``{"status": ..., "request_id": ...}``
        for HTTP errors.
    """
    if isinstance(exc, ModelHTTPError):
        details = {"status": exc.status, "request_id": exc.request_id}
        if exc.retryable:
            return ApplicationError(
                str(exc),
                details,
                type=MODEL_UNAVAILABLE,
                next_retry_delay=_retry_delay(exc.retry_after_s),
            )
        return ApplicationError(str(exc), details, type=MODEL_REQUEST_REJECTED, non_retryable=True)
    if isinstance(exc, ModelRequestError):
        return ApplicationError(str(exc), type=MODEL_REQUEST_REJECTED, non_retryable=True)
    if isinstance(exc, ModelResponseError):
        return ApplicationError(str(exc), type=MODEL_RESPONSE_INVALID, non_retryable=True)
    if isinstance(exc, ScriptExhaustedError):
        return ApplicationError(str(exc), type=MODEL_SCRIPT_EXHAUSTED, non_retryable=True)
    if isinstance(exc, ModelConnectionError) or _is_transport_error(exc):
        return ApplicationError(
            f"model unreachable ({type(exc).__name__}): {exc}", type=MODEL_UNAVAILABLE
        )
    return ApplicationError(f"{type(exc).__name__}: {exc}", type=type(exc).__name__)


def _is_transport_error(exc: BaseException) -> bool:
    # Imported here, not at the top: workflow code imports this module and must not load
    # an HTTP client; only activity code ever calls this function. httpx2 is the SDKs'
    # transport, httpx the one of hand-built clients.
    import httpx
    import httpx2

    return isinstance(exc, httpx.TransportError | httpx2.TransportError)
