"""``tooltrail codec-server``: Temporal's remote codec endpoint, for the Temporal UI and CLI.

With ``TOOLTRAIL_CODEC_KEYS`` set, Temporal stores only ciphertext (``tooltrail.runtime.codec``), so
its UI and CLI show ``binary/encrypted`` payloads. A codec server decodes them for whoever
holds its bearer token: the UI (``TEMPORAL_CODEC_ENDPOINT``, or its "Codec Server" setting)
and the CLI (``temporal ... --codec-endpoint URL --codec-auth "Bearer TOKEN"``) send the
payloads they show to ``POST {endpoint}/decode`` (and ``/encode`` for what they send, such
as a signal's input) and display the answer.

The protocol is Temporal's: a JSON body ``{"payloads": [...]}`` in the protobuf JSON form
of ``temporal.api.common.v1.Payloads`` (metadata values and data in base64), answered in the
same form. The browser calls it cross-origin, so the server answers CORS preflights for the
configured UI origins, allowing the headers the UI sends (``Content-Type``,
``Authorization``, ``X-Namespace``). Every ``POST`` needs ``Authorization: Bearer <token>``
(``TOOLTRAIL_CODEC_SERVER_TOKEN``; the server refuses to start without one), or the same
token in the cookie that ``/login`` sets for a browser: the Temporal UI sends an
``Authorization`` header only with its own OIDC access token, but with "include cross-origin
credentials" it sends the codec server's cookies. Preflights carry no credentials by the
CORS rules, so they need none and reveal nothing.

Every request body is bounded before it is read, and read incrementally: a ``Content-Length``
over the limit is answered 413 at once, and a chunked (unsized) body is refused with 413 as
soon as it grows past the limit, so what a request can make the server hold is the limit
plus one chunk, whoever sends it (``/login`` takes no token before its body is read: its
limit is ``LOGIN_MAX_BODY_BYTES``). uvicorn reads and discards the rest of a refused body
without keeping it.

Built on Starlette and uvicorn (both already installed with tooltrail, as MCP's HTTP
transport uses them): uvicorn brings a hardened HTTP/1.1 parser and TLS (``--tls-cert`` /
``--tls-key``), which a hand-written stdlib server would have to re-implement.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from tooltrail.errors import ConfigurationError
from tooltrail.runtime.codec import PayloadDecryptionError, codec_from_settings
from tooltrail.settings import Settings

__all__ = [
    "ALLOWED_HEADERS",
    "COOKIE",
    "DEFAULT_PORT",
    "LOGIN_MAX_BODY_BYTES",
    "MAX_BODY_BYTES",
    "MIN_TOKEN_LENGTH",
    "build_app",
    "serve",
]

log = logging.getLogger("tooltrail.codec_server")

DEFAULT_PORT = 8081
"""The port of Temporal's codec server samples."""
ALLOWED_HEADERS = "Content-Type, Authorization, X-Namespace"
"""What the Temporal UI sends with a codec request (its preflight asks for these)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""The default largest body of ``/encode`` and ``/decode``: a history page of payloads of up
to 2 MiB each (``TOOLTRAIL_CODEC_SERVER_MAX_BODY_BYTES`` changes it)."""
LOGIN_MAX_BODY_BYTES = 64 * 1024
"""The largest body ``/login`` reads: its form holds one token."""
COOKIE = "tooltrail_codec_token"
"""The cookie ``/login`` sets: the token, for browsers (the Temporal UI; see ``_login``)."""
COOKIE_MAX_AGE_S = 12 * 3600
"""How long a browser stays signed in."""
MIN_TOKEN_LENGTH = 16
"""The shortest bearer token accepted (``secrets.token_urlsafe(32)`` makes 43 characters)."""


def _problem(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or ``None`` as soon as it is known to exceed ``limit`` bytes.

    Never ``request.body()``, which keeps whatever arrives: a declared length over the
    limit is refused unread, and an unsized (chunked) body is read chunk by chunk and
    dropped once past the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _too_large(limit: int, headers: dict[str, str] | None = None) -> Response:
    return _problem(413, f"the request body exceeds the limit of {limit} bytes", headers)


async def _read_payloads(
    request: Request, headers: dict[str, str], limit: int
) -> Payloads | Response:
    """The request's payloads, or the error response for a body too large or malformed."""
    body = await _read_body(request, limit)
    if body is None:
        return _too_large(limit, headers)
    payloads = Payloads()
    try:
        json_format.Parse(body or b"{}", payloads)
    except (json_format.ParseError, UnicodeDecodeError, ValueError) as exc:
        return _problem(400, f'expected {{"payloads": [...]}}: {exc}', headers)
    return payloads


def build_app(
    codec: PayloadCodec,
    *,
    token: str,
    origins: Sequence[str],
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """Return the codec server's ASGI application.

    Args:
        codec: the payload codec (``AesGcmCodec``).
        token: the bearer token every ``POST`` must carry (or the cookie of ``/login``).
        origins: the browser origins allowed to call it (the Temporal UI's, e.g.
            ``http://localhost:8233``); ``*`` allows any.
        max_body_bytes: the largest body ``/encode`` and ``/decode`` read; a larger one is
            answered 413 (``/login`` reads at most ``LOGIN_MAX_BODY_BYTES``).

    Raises:
        ConfigurationError: the token is shorter than ``MIN_TOKEN_LENGTH``.
    """
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"the codec server's token must be at least {MIN_TOKEN_LENGTH} characters "
            "(make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    expected = f"Bearer {token}".encode()
    raw = token.encode()
    allowed = {origin.rstrip("/") for origin in origins}

    def cors(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is None or not (origin.rstrip("/") in allowed or "*" in allowed):
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            # The UI may send cookies ("include cross-origin credentials").
            "Access-Control-Allow-Credentials": "true",
            "Vary": "Origin",
        }

    async def preflight(request: Request) -> Response:
        headers = cors(request)
        if not headers:
            return _problem(403, "origin not allowed", {"Vary": "Origin"})
        headers |= {
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": ALLOWED_HEADERS,
            "Access-Control-Max-Age": "600",
        }
        return Response(status_code=204, headers=headers)

    async def handle(request: Request, *, decode: bool) -> Response:
        headers = cors(request)
        given = request.headers.get("authorization", "").encode()
        cookie = request.cookies.get(COOKIE, "").encode()
        if not (hmac.compare_digest(given, expected) or hmac.compare_digest(cookie, raw)):
            return _problem(
                401, "a bearer token is required", headers | {"WWW-Authenticate": "Bearer"}
            )
        payloads = await _read_payloads(request, headers, max_body_bytes)
        if isinstance(payloads, Response):
            return payloads
        try:
            converted = await (codec.decode if decode else codec.encode)(payloads.payloads)
        except PayloadDecryptionError as exc:
            # Names key ids only, never key material (see tooltrail.runtime.codec).
            return _problem(400, str(exc), headers)
        answer = json_format.MessageToDict(Payloads(payloads=converted))
        answer.setdefault("payloads", [])
        return Response(json.dumps(answer), media_type="application/json", headers=headers)

    async def encode(request: Request) -> Response:
        if request.method == "OPTIONS":
            return await preflight(request)
        return await handle(request, decode=False)

    async def decode(request: Request) -> Response:
        if request.method == "OPTIONS":
            return await preflight(request)
        return await handle(request, decode=True)

    async def login(request: Request) -> Response:
        return await _login(request, raw)

    return Starlette(
        routes=[
            Route("/encode", encode, methods=["POST", "OPTIONS"]),
            Route("/decode", decode, methods=["POST", "OPTIONS"]),
            Route("/login", login, methods=["GET", "POST"]),
        ]
    )


_LOGIN_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>tooltrail codec server</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>tooltrail codec server</h1>
<p>{message}</p>
<form method="post" action="login">
<label>Token <input type="password" name="token" autocomplete="off" size="48"></label>
<button type="submit">Sign in</button>
</form>
<p>This browser then sends the token as a cookie to the codec server: turn on
<em>Include cross-origin credentials</em> in the Temporal UI's codec server settings
(<code>TEMPORAL_CODEC_INCLUDE_CREDENTIALS=true</code>).</p>
</body></html>
"""


async def _login(request: Request, token: bytes) -> Response:
    """Sign a browser in: the token, checked, is kept in an HttpOnly cookie for 12 hours.

    For the Temporal UI, which sends an ``Authorization`` header only with its own OIDC
    access token: with "include cross-origin credentials" on, its codec requests carry the
    cookie. ``SameSite=Strict``: the UI's origin and the codec server's must be the same
    site (the same host name; ports may differ), and no other site's page can use it.
    """
    page = "Paste the codec server's token to decode payloads in this browser."
    if request.method == "GET":
        return HTMLResponse(_LOGIN_PAGE.format(message=page))
    # Anyone may post here, token or not: the body is bounded before it is read.
    body = await _read_body(request, LOGIN_MAX_BODY_BYTES)
    if body is None:
        return _too_large(LOGIN_MAX_BODY_BYTES)
    fields = parse_qs(body.decode("utf-8", "replace"))
    given = (fields.get("token") or [""])[0].strip().encode()
    if not hmac.compare_digest(given, token):
        return HTMLResponse(_LOGIN_PAGE.format(message="That is not the token."), 401)
    response = HTMLResponse(
        _LOGIN_PAGE.format(message="Signed in: reload the Temporal UI."), status_code=200
    )
    response.set_cookie(
        COOKIE,
        given.decode(),
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    origins: Sequence[str] | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> None:
    """Run the codec server until it is stopped (SIGINT/SIGTERM).

    Args:
        settings: the keys (``codec_keys``) and the token (``codec_server_token``).
        host: the address to listen on.
        port: the port to listen on.
        origins: allowed browser origins (default: the settings' ``codec_server_origins``).
        tls_cert: PEM certificate to serve HTTPS with (default: the settings').
        tls_key: its PEM private key (default: the settings').

    Raises:
        ConfigurationError: no codec keys, no (or a short) token, or half a TLS pair.
    """
    import uvicorn

    _Server = _server_class()
    codec = codec_from_settings(settings)
    if codec is None:
        raise ConfigurationError("the codec server needs TOOLTRAIL_CODEC_KEYS")
    if settings.codec_server_token is None:
        raise ConfigurationError(
            "the codec server needs a bearer token: set TOOLTRAIL_CODEC_SERVER_TOKEN "
            "(make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    cert = tls_cert or settings.codec_server_tls_cert
    key = tls_key or settings.codec_server_tls_key
    if (cert is None) != (key is None):
        raise ConfigurationError("TLS needs both a certificate and its key (--tls-cert, --tls-key)")
    allowed = list(origins) if origins else settings.codec_server_origin_list()
    app = build_app(
        codec,
        token=settings.codec_server_token.get_secret_value(),
        origins=allowed,
        max_body_bytes=settings.codec_server_max_body_bytes,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(cert) if cert else None,
        ssl_keyfile=str(key) if key else None,
        # tooltrail's logging (its format, its secret filter) rather than uvicorn's own.
        log_config=None,
        server_header=False,
    )
    scheme = "https" if cert else "http"
    if cert is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "the codec server listens on %s without TLS: the token and the plaintext "
            "payloads cross the network in the clear (give it --tls-cert and --tls-key)",
            host,
        )
    log.info(
        "codec server on %s://%s:%d for origins %s (key ids %s)",
        scheme,
        host,
        port,
        ", ".join(allowed) or "(none)",
        ", ".join(getattr(codec, "key_ids", ())),
    )
    await _Server(config).serve()


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that SIGINT/SIGTERM end it with exit status 0.

        uvicorn re-raises the signal once it has shut down (the process then dies of it, 143);
        like ``tooltrail worker``, a stopped codec server is a clean exit.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server
