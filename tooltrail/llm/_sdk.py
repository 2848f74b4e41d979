"""What the two provider clients share: one mapping of the SDKs' failures, and their lifetime.

Both clients call the official SDK of their provider (``openai``, ``anthropic``), whose
exception trees have the same shape (``APIStatusError`` with the response, and
``APIConnectionError`` / ``APITimeoutError`` without one). ``sdk_errors`` turns them into
tooltrail's own (``ModelHTTPError``, ``ModelConnectionError``, ...), so ``classify`` and
``to_application_error`` decide retries as they always did: with the SDKs' own retries off
(``max_retries=0``), Temporal's retry policy is the only retry loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType, TracebackType
from typing import Any, Self

from tooltrail.llm.errors import (
    ModelConnectionError,
    ModelHTTPError,
    ModelRequestError,
    ModelResponseError,
    parse_retry_after,
)

__all__ = ["SDKModelClient", "field", "missing_extra", "sdk_errors"]

log = logging.getLogger("tooltrail.model")

_BODY_EXCERPT = 500
"""Characters of a non-JSON body quoted in an error message."""


def missing_extra(package: str, client: str) -> str:
    """The message of the ``ImportError`` raised when a client's SDK is not installed."""
    return (
        f"{client} runs on the {package!r} package, which is not installed: "
        f"install it with `pip install 'tooltrail[{package}]'`"
    )


def field(item: Any, name: str) -> Any:
    """Return ``item.name``, or ``item[name]`` for a plain dict.

    The SDKs build their response objects without validation, so a compatible server's
    slightly different answer (a tool call without ``type``, content as a list of parts)
    can leave plain dicts inside them.

    Raises:
        KeyError: a dict without ``name``.
        AttributeError: an object without ``name``.
    """
    if isinstance(item, dict):
        return item[name]
    return getattr(item, name)


def _error_message(response: Any) -> str:
    # OpenAI: {"error": {"message": ...}}; Anthropic: {"type": "error", "error": {...}}.
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type")
            return f"{error['message']} ({kind})" if isinstance(kind, str) else error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return str(body["message"])
    text = str(response.text).strip()
    return text[:_BODY_EXCERPT] or str(response.reason_phrase) or "no error message"


def _should_retry(headers: Any) -> bool | None:
    # OpenAI's and Anthropic's servers may override the status-based verdict.
    value = str(headers.get("x-should-retry", "")).strip().lower()
    return {"true": True, "false": False}.get(value)


@contextmanager
def sdk_errors(sdk: ModuleType, where: str) -> Iterator[None]:
    """Translate the failures of one SDK call into tooltrail's ``ModelError`` tree.

    Args:
        sdk: the SDK module (``openai`` or ``anthropic``), whose exception classes to map.
        where: the endpoint, for messages.

    Raises:
        ModelHTTPError: an HTTP error status (the provider's message, ``Retry-After``,
            ``x-should-retry`` and request id kept).
        ModelConnectionError: no answer (connect failure, timeout, dropped connection).
        ModelResponseError: a success status whose body is not JSON or not of the shape.
        ModelRequestError: the SDK refused to send the request.
    """
    try:
        yield
    except sdk.APIStatusError as exc:
        response = exc.response
        raise ModelHTTPError(
            exc.status_code,
            _error_message(response),
            parse_retry_after(response.headers),
            retryable=_should_retry(response.headers),
            request_id=exc.request_id,
        ) from exc
    except sdk.APIResponseValidationError as exc:
        raise ModelResponseError(
            f"{where!r} answered with a body of the wrong shape: {exc}; check the base URL"
        ) from exc
    except sdk.APIConnectionError as exc:
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        raise ModelConnectionError(
            f"no answer from {where!r} ({type(exc).__name__}): {detail}"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ModelResponseError(
            f"{where!r} answered with a body that is not JSON: {exc.doc[:_BODY_EXCERPT]!r}; "
            "check the base URL"
        ) from exc
    except (ValueError, TypeError) as exc:
        # Raised before anything was sent (a max_tokens too long for a request that is not
        # streamed, no credentials): the same request would be refused again.
        raise ModelRequestError(
            f"the {sdk.__name__} SDK refused the request to {where!r}: {exc}"
        ) from exc


class SDKModelClient:
    """Base of the provider clients: owns (or borrows) one SDK client.

    Args:
        sdk_client: the SDK's async client.
        owned: close it with this client (it was built here, with no borrowed HTTP client).
    """

    def __init__(self, sdk_client: Any, *, owned: bool) -> None:
        self._sdk_client = sdk_client
        self._owned = owned
        self._warned: set[tuple[str, str]] = set()

    def _drop_once(self, setting: str, model: str, why: str) -> None:
        """Log, once per setting and model, that a setting is not sent."""
        if (setting, model) not in self._warned:
            self._warned.add((setting, model))
            log.warning("%s is not sent to model %r: %s", setting, model, why)

    async def aclose(self) -> None:
        """Close the SDK client, if this client built it (a borrowed one stays open)."""
        if self._owned:
            await self._sdk_client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
