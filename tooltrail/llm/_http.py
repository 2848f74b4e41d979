"""The HTTP plumbing the provider clients share: one POST, and one mapping of its failures.

The httpx client built here never retries (``retries=0`` on the transport, no redirects):
the model activity's Temporal retry policy is the only retry loop.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self

import httpx

from tooltrail.llm.errors import (
    ModelConnectionError,
    ModelHTTPError,
    ModelResponseError,
    parse_retry_after,
)

__all__ = ["HTTPModelClient", "build_http_client"]

_BODY_EXCERPT = 500
"""Characters of a non-JSON error body quoted in the error message."""


def build_http_client(timeout_s: float) -> httpx.AsyncClient:
    """Return an httpx client that never retries and never follows redirects."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(retries=0),
        timeout=httpx.Timeout(timeout_s),
        follow_redirects=False,
    )


def _error_message(response: httpx.Response) -> str:
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
    text = response.text.strip()
    return text[:_BODY_EXCERPT] or response.reason_phrase or "no error message"


def _should_retry(headers: httpx.Headers) -> bool | None:
    # OpenAI's and Anthropic's servers may override the status-based verdict.
    value = headers.get("x-should-retry", "").strip().lower()
    return {"true": True, "false": False}.get(value)


class HTTPModelClient:
    """Base of the provider clients: owns (or borrows) an httpx client and posts JSON."""

    _request_id_header = "x-request-id"

    def __init__(self, *, timeout_s: float, http: httpx.AsyncClient | None) -> None:
        """Use ``http`` as given (the caller closes it), else build a non-retrying client."""
        self._owns_http = http is None
        self._http = http if http is not None else build_http_client(timeout_s)

    async def _post(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
        """POST ``body`` as JSON and return the decoded JSON answer.

        Raises:
            ModelHTTPError: the answer's status is not 2xx.
            ModelConnectionError: no answer (connect failure, timeout, dropped connection).
            ModelResponseError: a 2xx answer that is not JSON.
        """
        try:
            response = await self._http.post(url, headers=headers, json=body)
        except httpx.TransportError as exc:
            raise ModelConnectionError(
                f"no answer from {url!r} ({type(exc).__name__}): {exc}"
            ) from exc
        if not response.is_success:
            raise ModelHTTPError(
                response.status_code,
                _error_message(response),
                parse_retry_after(response.headers),
                retryable=_should_retry(response.headers),
                request_id=response.headers.get(self._request_id_header),
            )
        try:
            return json.loads(response.content)
        except ValueError as exc:
            excerpt = response.text[:_BODY_EXCERPT]
            raise ModelResponseError(
                f"{url!r} answered {response.status_code} with a body that is not JSON: "
                f"{excerpt!r}; check the base URL"
            ) from exc

    async def aclose(self) -> None:
        """Close the httpx client, if this client built it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
