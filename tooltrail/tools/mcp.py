"""MCP toolsets: the tools of an MCP server, registered as dynamic tools of a registry.

``register_mcp_server`` starts (stdio) or reaches (streamable HTTP) one MCP server, lists
its tools and registers each as a ``DynamicTool`` whose handler calls the tool over one MCP
session. The session belongs to the ``McpToolset``, so to the worker process that registered
it: every attempt on that worker shares it, and no MCP state crosses the activity boundary
(Temporal only ever sees the call's arguments and its text result).

Why a background task owns the session: the MCP SDK is built on anyio, whose transports
(``stdio_client``, ``streamable_http_client``) and ``ClientSession`` hold task groups and
cancel scopes that must be entered and exited by the *same* task. Tool attempts run in
whatever task the activity gets, so the session is opened and closed by a task of its own,
and attempts only send requests over it.

Arguments are checked against the tool's input schema (JSON Schema, as the server lists it)
before the call: a call that does not fit is a guardrail violation the model reads
(``guardrail violation: <field>: <reason>``), as for any tool, and the server never sees it.

Workers get their servers from ``tooltrail worker --mcp "PREFIX=COMMAND ARGS"`` (and
``--mcp-url "PREFIX=URL"``, or the ``TOOLTRAIL_MCP_SERVERS`` setting): ``open_mcp_servers``
registers them when the worker starts, in its event loop, and closes them when it stops.
Clients do not start servers: they learn the tool names from a worker
(``Tooltrail.worker_tools``).

Failures: a session that breaks (the server process died, the HTTP server went away) is
re-established once per call, and the call sent again. A tool that was running when its
server died may therefore run twice; MCP tools are never idempotent here (``DynamicTool``),
so treat them as at-least-once. Everything a model should read becomes a soft result
(``ToolError``): an ``isError`` result (its text), an MCP error response, a server that is
still unreachable after the reconnect. Only cancellation propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

import anyio
import jsonschema
from jsonschema.protocols import Validator
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from mcp.types import Tool as McpTool

from tooltrail.core.results import ImagePart, Part, TextPart, ToolOutput
from tooltrail.errors import (
    ConfigurationError,
    DuplicateToolError,
    RegistryFrozenError,
    ToolError,
)
from tooltrail.settings import McpServerSpec
from tooltrail.tools import ArgumentsRejected, DynamicTool, Snapshot, ToolContext, ToolRegistry

__all__ = [
    "McpServerSpec",
    "McpServerTool",
    "McpServerUnavailable",
    "McpToolset",
    "open_mcp_servers",
    "register_mcp_server",
]

log = logging.getLogger("tooltrail.mcp")

_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# A paginating server that never stops must not hang worker start-up.
_MAX_LIST_PAGES = 100
# How long closing a session may take before its task is cancelled (stdio's own shutdown
# sequence is bounded at about 6.5 s: stdin close, SIGTERM, SIGKILL).
_CLOSE_TIMEOUT_S = 10.0

ClientFactory = Callable[[AsyncExitStack], Awaitable[Client]]
"""Enters what one session needs on the exit stack and returns the MCP client, not entered."""


# At most this many schema problems are listed in one guardrail violation.
_MAX_SCHEMA_ITEMS = 10
_JSON_TYPES = {"array": "list", "object": "object", "integer": "integer", "number": "number"}


def _schema_validator(name: str, schema: dict[str, Any]) -> Validator | None:
    """A validator for an MCP tool's input schema, or ``None`` if the schema is unusable.

    MCP input schemas are JSON Schema (2020-12 unless ``$schema`` says otherwise). A server
    that lists a broken schema keeps its tool; the server then judges the arguments itself.
    """
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        log.warning("MCP tool %r lists an invalid input schema (%s); not checked", name, exc)
        return None
    return cls(schema)


def _location(path: Sequence[Any]) -> str:
    return ".".join(str(part) for part in path) or "(arguments)"


def _schema_items(validator: Validator, arguments: Mapping[str, Any]) -> list[str]:
    """The ``<field>: <reason>`` items of every way ``arguments`` break the schema."""
    items: list[str] = []
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    for error in errors[:_MAX_SCHEMA_ITEMS]:
        where = list(error.absolute_path)
        # The stubs allow "unset" for these; a reported error always has them.
        value: Any = error.validator_value
        instance: Any = error.instance
        schema: Any = error.schema
        if error.validator == "required":
            missing = next((p for p in value if p not in instance), None)
            items.append(f"{_location([*where, missing])}: field required")
        elif error.validator == "additionalProperties" and isinstance(instance, dict):
            allowed = set(schema.get("properties", {}))
            for extra in sorted(k for k in instance if k not in allowed):
                items.append(f"{_location([*where, extra])}: unexpected argument")
        elif error.validator == "type":
            names = [value] if isinstance(value, str) else list(value)
            kinds = " or ".join(_JSON_TYPES.get(n, n) for n in names)
            items.append(f"{_location(where)}: not a valid {kinds}")
        else:
            # jsonschema's own words; they may quote the value, so keep them short.
            message = error.message if len(error.message) <= 200 else error.message[:199] + "…"
            items.append(f"{_location(where)}: {message}")
    return items


class McpServerTool(DynamicTool):
    """An MCP server's tool: a dynamic tool whose arguments are checked against its schema."""

    def __init__(
        self,
        name: str,
        *,
        description: str,
        parameters: Mapping[str, Any],
        handler: Callable[[dict[str, Any], ToolContext], Awaitable[Any]],
    ) -> None:
        """Create the tool (``register_mcp_server`` does).

        Raises:
            ToolDefinitionError: as ``DynamicTool``.
        """
        super().__init__(name, description=description, parameters=parameters, handler=handler)
        self._validator = _schema_validator(name, self._parameters)

    def validate(self, arguments: Mapping[str, Any] | None) -> Snapshot:
        """Check the arguments against the tool's input schema; return the raw snapshot.

        Raises:
            ArgumentsRejected: with ``guardrail violation: <field>: <reason>; ...``.
        """
        snapshot = super().validate(arguments)
        if self._validator is not None and snapshot.arguments is not None:
            items = _schema_items(self._validator, snapshot.arguments)
            if items:
                raise ArgumentsRejected.of(items, stage="raw")
        return snapshot


class McpServerUnavailable(ConfigurationError):
    """Raised when an MCP server cannot be started or reached, or refuses the handshake.

    ``register_mcp_server`` raises it; at call time its text, ``MCP server '<name>' is
    unavailable: <reason>``, becomes the call's soft result.
    """


def _describe(exc: BaseException) -> str:
    """Say what went wrong, unwrapping anyio's exception groups to their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, OSError) else text


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means the session is broken (worth one reconnect), not a tool error.

    An MCP error *response* (invalid params, unknown tool, a timeout) came over a working
    session, so it is not one; neither is a result that fails validation.
    """
    for leaf in _leaves(exc):
        if isinstance(leaf, MCPError):
            if leaf.code == CONNECTION_CLOSED:
                return True
        elif isinstance(
            leaf,
            OSError
            | EOFError
            | anyio.ClosedResourceError
            | anyio.BrokenResourceError
            | anyio.EndOfStream
            | McpServerUnavailable,
        ):
            return True
        elif type(leaf).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
            # The HTTP transport's errors (connect refused, reset, remote closed), without
            # importing an HTTP client this module otherwise does not need.
            return True
    return False


class _Session:
    """One MCP session, opened and closed by a task of its own (see the module docstring)."""

    def __init__(self, label: str, factory: ClientFactory) -> None:
        self.label = label
        self.loop = asyncio.get_running_loop()
        self.client: Client | None = None
        self.broken = False
        self._factory = factory
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, timeout_s: float) -> None:
        """Start the owner task and wait for the handshake.

        Raises:
            McpServerUnavailable: the server could not be started or reached in time.
        """
        ready: asyncio.Future[Client] = self.loop.create_future()
        self._task = self.loop.create_task(self._own(ready), name=f"mcp-session:{self.label}")
        try:
            async with asyncio.timeout(timeout_s):
                # Shielded: a timeout here must cancel the owner task explicitly (below),
                # so that it unwinds the transport it may have half opened.
                self.client = await asyncio.shield(ready)
        except BaseException as exc:
            await self._cancel_owner()
            if isinstance(exc, TimeoutError):
                raise McpServerUnavailable(
                    f"MCP server {self.label!r} is unavailable: no handshake within {timeout_s:g}s"
                ) from None
            if isinstance(exc, Exception):
                raise McpServerUnavailable(
                    f"MCP server {self.label!r} is unavailable: {_describe(exc)}"
                ) from exc
            raise

    async def _own(self, ready: asyncio.Future[Client]) -> None:
        try:
            async with AsyncExitStack() as stack:
                client = await self._factory(stack)
                await stack.enter_async_context(client)
                if ready.done():  # the opener gave up meanwhile
                    return
                ready.set_result(client)
                await self._stop.wait()
        except Exception as exc:
            self.broken = True
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.debug("MCP session %r ended with %s", self.label, _describe(exc))
        finally:
            self.broken = True
            if not ready.done():
                ready.cancel()

    async def _cancel_owner(self) -> None:
        if self._task is None or self._task.done():
            return
        self._task.cancel()
        # wait(), not await: the owner's own end is no error of ours, while a cancellation
        # of the caller must still propagate.
        await asyncio.wait([self._task])

    async def call_tool(
        self, name: str, arguments: dict[str, Any], timeout_s: float | None
    ) -> CallToolResult:
        """Call ``name`` over this session.

        Raises:
            MCPError, OSError, ...: as the MCP client raises them.
        """
        if self.client is None or self.broken:
            raise MCPError(code=CONNECTION_CLOSED, message="session is closed")
        return await self.client.call_tool(name, arguments, read_timeout_seconds=timeout_s)

    async def list_tools(self) -> list[McpTool]:
        """Return every tool the server lists, following pagination."""
        assert self.client is not None, "list_tools() before open()"
        tools: list[McpTool] = []
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await self.client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        log.warning("MCP server %r lists more than %d pages of tools", self.label, _MAX_LIST_PAGES)
        return tools

    async def close(self) -> None:
        """End the session (stops a stdio server process); idempotent."""
        self.broken = True
        self._stop.set()
        if self._task is None or self._task.done():
            return
        _, pending = await asyncio.wait([self._task], timeout=_CLOSE_TIMEOUT_S)
        if pending:
            log.warning("MCP session %r did not close in time; cancelling it", self.label)
            await self._cancel_owner()


class McpToolset:
    """The tools of one MCP server in a registry, and the session they share.

    Create it with ``register_mcp_server``. Close it (``await toolset.aclose()`` or
    ``async with``) when the worker stops, on the event loop that runs the worker.
    """

    def __init__(
        self,
        label: str,
        factory: ClientFactory,
        *,
        connect_timeout_s: float,
        call_timeout_s: float | None,
    ) -> None:
        """Create a toolset (prefer ``register_mcp_server``).

        Args:
            label: names the server in messages.
            factory: opens one MCP client, called for every (re)connection.
            connect_timeout_s: limit of one start-up and handshake.
            call_timeout_s: limit of one ``tools/call`` round trip (``None``: the activity's
                own timeout is the limit).
        """
        self.label = label
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.tools: dict[str, str] = {}
        """Registered name → the server's name for the tool."""
        self.sessions_opened = 0
        """Sessions opened so far; more than one means the toolset reconnected."""
        self._factory = factory
        self._session: _Session | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def _loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _live(self) -> _Session | None:
        session = self._session
        if session is None or session.broken:
            return None
        if session.loop is not asyncio.get_running_loop():
            # Registered under one event loop, called under another (asyncio.run twice):
            # that session's tasks cannot run here, so it is abandoned and a new one opened.
            log.warning("MCP server %r: new event loop, opening a new session", self.label)
            self._session = None
            return None
        return session

    async def _reconnect(self, failed: _Session | None) -> _Session:
        """Return a working session, opening one unless another call already did.

        Raises:
            McpServerUnavailable: the new session could not be opened.
        """
        async with self._loop_lock():
            current = self._live()
            if current is not None and current is not failed:
                return current
            old, self._session = self._session, None
            if old is not None:
                self._close_in_background(old)
            session = _Session(self.label, self._factory)
            await session.open(self.connect_timeout_s)
            self.sessions_opened += 1
            self._session = session
            return session

    def _close_in_background(self, session: _Session) -> None:
        # A broken session's shutdown (killing a stuck process, an HTTP DELETE to a dead
        # server) must not delay the call that is about to run on the new one.
        if session.loop is not asyncio.get_running_loop():
            return
        task = session.loop.create_task(session.close(), name=f"mcp-close:{self.label}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @property
    def reconnects(self) -> int:
        """Sessions opened after the first one (a health signal)."""
        return max(0, self.sessions_opened - 1)

    async def connect(self) -> None:
        """Open the session now (the first call would otherwise).

        Raises:
            McpServerUnavailable: the server could not be started or reached.
        """
        if self._live() is None:
            await self._reconnect(None)

    async def list_tools(self) -> list[McpTool]:
        """Return the server's tools (opens the session if needed).

        Raises:
            McpServerUnavailable: the server could not be started or reached.
        """
        await self.connect()
        session = self._live()
        assert session is not None, "connect() leaves a live session"
        return await session.list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        """Call the server's tool ``name``; re-establish a broken session once.

        Raises:
            McpServerUnavailable: no session could be opened.
            MCPError: the server answered with an error (or the session broke again).
        """
        session = self._live()
        reconnected = False
        if session is None:
            session = await self._reconnect(None)
            reconnected = True
        while True:
            try:
                return await session.call_tool(name, arguments, self.call_timeout_s)
            except Exception as exc:
                if reconnected or not _is_connection_failure(exc):
                    raise
                log.warning(
                    "MCP server %r: session broke during %r (%s); reconnecting once",
                    self.label,
                    name,
                    _describe(exc),
                )
                session.broken = True
            session = await self._reconnect(session)
            reconnected = True

    async def kill_session(self) -> None:
        """Close the current session as if it had failed; the next call reconnects."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        """Close the session (a stdio server process stops) and wait for pending closes."""
        await self.kill_session()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def __aenter__(self) -> McpToolset:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def handler(
        self, name: str
    ) -> Callable[[dict[str, Any], ToolContext], Awaitable[str | ToolOutput]]:
        """Return the dynamic tool handler that calls the server's tool ``name``."""

        async def call(arguments: dict[str, Any], _ctx: ToolContext) -> str | ToolOutput:
            try:
                result = await self.call_tool(name, arguments)
            except McpServerUnavailable as exc:
                raise ToolError(str(exc)) from exc
            except MCPError as exc:
                if _is_connection_failure(exc):
                    raise ToolError(
                        f"MCP server {self.label!r} is unavailable: {exc.message}"
                    ) from exc
                if exc.code == REQUEST_TIMEOUT and self.call_timeout_s is not None:
                    raise ToolError(
                        f"MCP tool {name!r} timed out after {self.call_timeout_s:g}s"
                    ) from exc
                raise ToolError(f"MCP tool {name!r} failed: {exc.message}") from exc
            except Exception as exc:
                if _is_connection_failure(exc):
                    raise ToolError(
                        f"MCP server {self.label!r} is unavailable: {_describe(exc)}"
                    ) from exc
                raise
            return result_value(result, name)

        call.__name__ = call.__qualname__ = f"mcp_{_NAME_CHARS.sub('_', name)}"
        return call


def _block_text(block: Any) -> str | None:
    """Render a non-image content block as text for the model."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return resource.text
        if isinstance(resource, BlobResourceContents):
            return f"[binary resource {resource.uri} ({resource.mime_type or 'unknown type'})]"
    if isinstance(block, ResourceLink):
        return f"[resource {block.uri}" + (f": {block.name}]" if block.name else "]")
    if isinstance(block, AudioContent):
        return f"[audio ({block.mime_type}) omitted]"
    return None


def result_value(result: CallToolResult, name: str) -> str | ToolOutput:
    """Turn an MCP tool result into a tool body's return value.

    Text blocks are joined with newlines; images become a multipart ``ToolOutput``; a result
    with structured content only returns its JSON.

    Raises:
        ToolError: the result has ``isError`` set (its text is the soft error).
    """
    texts: list[str] = []
    parts: list[Part] = []
    has_image = False
    for block in result.content:
        if isinstance(block, ImageContent):
            has_image = True
            parts.append(ImagePart(media_type=block.mime_type, data_b64=block.data))
            continue
        text = _block_text(block)
        if text is not None:
            texts.append(text)
            parts.append(TextPart(text=text))
    if result.is_error:
        raise ToolError("\n".join(texts) or f"MCP tool {name!r} reported an error")
    if has_image:
        return ToolOutput(parts=parts)
    if not result.content and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(texts)


def _registered_name(prefix: str, name: str) -> str:
    # MCP allows '.', '/' and more in tool names; a registry name is [A-Za-z0-9_-]{1,64}.
    return prefix + _NAME_CHARS.sub("_", name)


def _stdio_factory(
    command: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | Path | None,
    errlog: TextIO | None,
) -> ClientFactory:
    params = StdioServerParameters(
        command=command[0], args=list(command[1:]), env=dict(env) if env else None, cwd=cwd
    )

    async def factory(_stack: AsyncExitStack) -> Client:
        # The transport context manager is single-use: a fresh one per session.
        return Client(stdio_client(params, errlog=errlog or sys.stderr), cache=None)

    return factory


def _http_factory(url: str, headers: Mapping[str, str] | None) -> ClientFactory:
    async def factory(stack: AsyncExitStack) -> Client:
        if not headers:
            return Client(streamable_http_client(url), cache=None)
        # Headers (auth) need an HTTP client of our own; the MCP SDK speaks httpx2, and the
        # transport leaves a client it was given open, so the session's stack closes it.
        import httpx2

        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=dict(headers), timeout=httpx2.Timeout(30.0, read=300.0))
        )
        return Client(streamable_http_client(url, http_client=http), cache=None)

    return factory


async def register_mcp_server(
    registry: ToolRegistry,
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    prefix: str = "",
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    headers: Mapping[str, str] | None = None,
    include: Collection[str] | None = None,
    name: str | None = None,
    connect_timeout_s: float = 60.0,
    call_timeout_s: float | None = None,
    errlog: TextIO | None = None,
) -> McpToolset:
    """Connect to an MCP server and register its tools in ``registry``.

    Call it in the worker process before ``build_worker`` (which freezes the registry); the
    session stays open for the toolset's calls. Each tool is registered as
    ``prefix + name`` (characters outside ``[A-Za-z0-9_-]`` become ``_``) with the server's
    description and input schema. Registration is all or nothing.

    Args:
        registry: where the tools go.
        command: start a stdio server: the executable and its arguments. The server gets
            only ``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM`` and ``USER`` of this
            process's environment (so no tooltrail secrets), plus ``env``.
        url: or reach a streamable HTTP server at this URL.
        prefix: prepended to every tool name (keeps two servers' tools apart).
        env: extra environment variables of a stdio server.
        cwd: working directory of a stdio server.
        headers: HTTP headers for every request to an HTTP server (e.g. authorization).
        include: register only these server tool names.
        name: names the server in messages (default: the command's program or the URL).
        connect_timeout_s: limit of start-up plus handshake.
        call_timeout_s: limit of one tool call round trip (default: none of its own).
        errlog: where a stdio server's stderr goes (default: this process's stderr).

    Returns:
        The toolset; ``aclose()`` it when the worker stops.

    Raises:
        ConfigurationError: not exactly one of ``command`` and ``url``, or an ``include``
            name the server does not offer.
        McpServerUnavailable: the server could not be started or reached.
        DuplicateToolError, ToolDefinitionError, RegistryFrozenError: as
            ``registry.register_dynamic``; nothing is registered then.
    """
    if (command is None) == (url is None) or (command is not None and not command):
        raise ConfigurationError("register_mcp_server() needs exactly one of command= and url=")
    if url is not None:
        factory = _http_factory(url, headers)
        label = name or url
    else:
        assert command is not None
        factory = _stdio_factory(command, env, cwd, errlog)
        label = name or os.path.basename(command[0])
    _check_not_frozen(registry, label)
    toolset = McpToolset(
        label, factory, connect_timeout_s=connect_timeout_s, call_timeout_s=call_timeout_s
    )
    try:
        tools = await toolset.list_tools()
        offered = {tool.name for tool in tools}
        missing = sorted(set(include or ()) - offered)
        if missing:
            raise ConfigurationError(
                f"MCP server {label!r} has no tools {missing}; it offers {sorted(offered)}"
            )
        chosen = [tool for tool in tools if include is None or tool.name in include]
        _register_all(registry, toolset, chosen, prefix)
    except BaseException:
        await toolset.aclose()
        raise
    log.info("MCP server %r: registered %s", label, ", ".join(sorted(toolset.tools)) or "nothing")
    return toolset


def _register_all(
    registry: ToolRegistry, toolset: McpToolset, tools: Sequence[McpTool], prefix: str
) -> None:
    """Register every tool, or none: everything is checked before the first is added.

    Raises:
        DuplicateToolError, ToolDefinitionError, RegistryFrozenError: as
            ``registry.register_dynamic``.
    """
    entries: list[tuple[str, McpTool]] = []
    for tool in tools:
        registered = _registered_name(prefix, tool.name)
        # Constructing the tool checks the name and the schema the way registering will.
        McpServerTool(
            registered,
            description="",
            parameters=tool.input_schema,
            handler=toolset.handler(tool.name),
        )
        if registered in registry or any(registered == seen for seen, _ in entries):
            raise DuplicateToolError(
                f"a tool named {registered!r} is already registered "
                f"(MCP server {toolset.label!r}, tool {tool.name!r}); use another prefix="
            )
        entries.append((registered, tool))
    _check_not_frozen(registry, toolset.label)
    for registered, tool in entries:
        registry.register(
            McpServerTool(
                registered,
                description=tool.description or tool.title or "",
                parameters=tool.input_schema,
                handler=toolset.handler(tool.name),
            )
        )
        toolset.tools[registered] = tool.name


def _check_not_frozen(registry: ToolRegistry, label: str) -> None:
    if registry.frozen:
        raise RegistryFrozenError(
            f"cannot register the tools of MCP server {label!r}: a worker was built on this "
            "registry; call register_mcp_server() before build_worker()"
        )


@contextlib.asynccontextmanager
async def open_mcp_servers(
    registry: ToolRegistry,
    specs: Sequence[McpServerSpec],
    *,
    connect_timeout_s: float = 60.0,
    errlog: TextIO | None = None,
) -> AsyncIterator[list[McpToolset]]:
    """Register the tools of every server in ``registry`` while the block runs; close after.

    Call it in the worker's event loop before the worker is built (which freezes the
    registry). All or nothing: if one server cannot be reached, those already opened close.

    Raises:
        McpServerUnavailable, ConfigurationError, DuplicateToolError: as
            ``register_mcp_server``.
    """
    async with AsyncExitStack() as stack:
        toolsets = []
        for spec in specs:
            toolset = await register_mcp_server(
                registry,
                command=spec.command or None,
                url=spec.url,
                prefix=spec.tool_prefix,
                name=spec.prefix or None,
                connect_timeout_s=connect_timeout_s,
                errlog=errlog,
            )
            stack.push_async_callback(toolset.aclose)
            toolsets.append(toolset)
        yield toolsets
