"""A scriptable local HTTP server that speaks enough OpenAI and Anthropic for client tests.

It answers every POST (``/v1/chat/completions``, ``/v1/messages``, anything) with the next
scripted reply and records what it received. Real sockets on 127.0.0.1, a port chosen by the
OS; the stdlib server runs in a thread, so async tests can call it with a real httpx client.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = [
    "Disconnect",
    "LLMServer",
    "RecordedRequest",
    "Reply",
    "anthropic_message",
    "openai_completion",
]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a status, headers and a JSON body (``bytes`` are sent raw)."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Disconnect:
    """Close the connection without answering (the client sees a transport error)."""


@dataclass(frozen=True)
class RecordedRequest:
    """What the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lowercased."""
    body: Any
    """The decoded JSON body (``None`` when it was not JSON)."""
    received_at: float = field(default_factory=time.monotonic)
    """When it arrived (``time.monotonic``)."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        action = self.server.owner._next(
            RecordedRequest(
                method="POST",
                path=self.path,
                headers={key.lower(): value for key, value in self.headers.items()},
                body=body,
            )
        )
        if isinstance(action, Disconnect):
            self.close_connection = True
            return
        payload = (
            action.body if isinstance(action.body, bytes) else json.dumps(action.body).encode()
        )
        self.send_response(action.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in action.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: LLMServer


class LLMServer:
    """The server: ``enqueue`` replies, point a client at ``url``, read ``requests``.

    Use as a context manager; with no reply queued it answers 500 ``no scripted reply``.
    """

    def __init__(self) -> None:
        self._replies: deque[Reply | Disconnect] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        """The server's root URL, e.g. ``http://127.0.0.1:54321``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def enqueue(self, *replies: Reply | Disconnect) -> None:
        """Queue replies, answered in order, one per request."""
        with self._lock:
            self._replies.extend(replies)

    def reply(self, status: int = 200, body: Any = None, **headers: str) -> None:
        """Queue one reply; header keywords use ``_`` for ``-`` (``retry_after="2"``)."""
        self.enqueue(
            Reply(status, body, {key.replace("_", "-"): value for key, value in headers.items()})
        )

    def _next(self, request: RecordedRequest) -> Reply | Disconnect:
        with self._lock:
            self.requests.append(request)
            if self._replies:
                return self._replies.popleft()
        return Reply(500, {"error": {"message": "no scripted reply", "type": "test_server"}})

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def openai_completion(
    content: str | None = None,
    tool_calls: Sequence[tuple[str, str, str]] = (),
    *,
    finish_reason: str | None = None,
    prompt_tokens: int = 11,
    completion_tokens: int = 7,
    id: str = "chatcmpl-1",
) -> dict[str, Any]:
    """A Chat Completions response; ``tool_calls`` are ``(id, name, raw arguments)``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in tool_calls
        ]
    return {
        "id": id,
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_message(
    *blocks: dict[str, Any],
    stop_reason: str = "end_turn",
    input_tokens: int = 13,
    output_tokens: int = 5,
    id: str = "msg_1",
) -> dict[str, Any]:
    """A Messages API response with the given content blocks."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": list(blocks),
        "stop_reason": stop_reason,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
