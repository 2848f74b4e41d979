"""A scriptable local HTTP server that speaks enough OpenAI and Anthropic for client tests.

It answers every POST (``/v1/chat/completions``, ``/v1/messages``, anything) with the next
scripted reply and records what it received. The success bodies of ``openai_completion`` and
``anthropic_message`` are built with the official SDKs' own response types
(``model_dump(mode="json")``), so they are what those SDKs say the APIs answer today. Real
sockets on 127.0.0.1, a port chosen by the OS; the stdlib server runs in a thread, so async
tests can call it with real clients.
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

from anthropic.types import Message as AnthropicMessage
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice

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
    delay_s: float = 0.0
    """Wait this long before answering (a slow generation)."""


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
        if action.delay_s:
            time.sleep(action.delay_s)
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
    cached_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    refusal: str | None = None,
    id: str = "chatcmpl-1",
) -> dict[str, Any]:
    """A Chat Completions response, built with the ``openai`` SDK's own ``ChatCompletion``.

    ``tool_calls`` are ``(id, name, raw arguments)``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in tool_calls
        ]
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None or cache_write_tokens is not None:
        usage["prompt_tokens_details"] = {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": cache_write_tokens,
        }
    completion = ChatCompletion(
        id=id,
        object="chat.completion",
        created=1_700_000_000,
        model="test-model",
        choices=[
            Choice(
                index=0,
                message=ChatCompletionMessage.model_validate(message),
                finish_reason=finish_reason or ("tool_calls" if tool_calls else "stop"),  # type: ignore[arg-type]
            )
        ],
        usage=CompletionUsage.model_validate(usage),
    )
    return completion.model_dump(mode="json")


def anthropic_message(
    *blocks: dict[str, Any],
    stop_reason: str = "end_turn",
    input_tokens: int = 13,
    output_tokens: int = 5,
    cache_read_input_tokens: int | None = None,
    cache_creation_input_tokens: int | None = None,
    stop_details: dict[str, Any] | None = None,
    id: str = "msg_1",
) -> dict[str, Any]:
    """A Messages API response with the given content blocks, built with the ``anthropic``
    SDK's own ``Message`` (so each block must be one of its content block types)."""
    message = AnthropicMessage.model_validate(
        {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": "test-model",
            "content": list(blocks),
            "stop_reason": stop_reason,
            "stop_details": stop_details,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cache_read_input_tokens": cache_read_input_tokens,
                "cache_creation_input_tokens": cache_creation_input_tokens,
            },
        }
    )
    return message.model_dump(mode="json")
