"""Host wiring: what a worker runs with (tools, hooks, observers, ...), never from request data."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tooltrail.recovery import NoopReflector, Reflector
from tooltrail.tools import Tool, ToolRegistry
from tooltrail.wire import ToolMeta

__all__ = ["Host"]


class Host:
    """Everything host-wired a worker needs; the client reads the tool catalog from it too."""

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Tool] = (),
        *,
        hooks: Sequence[Any] = (),
        observers: Sequence[Any] = (),
        middleware: Sequence[Any] = (),
        reflector: Reflector | None = None,
        circuit_breaker: Any = None,
        memory: bool = True,
        access: Any = None,
        database_url: str | None = None,
        scratch_base: Path | None = None,
        managed_scratch: bool = True,
    ) -> None:
        """Wire a host.

        Args:
            tools: a registry, or tools to register in a new one.
            hooks: pre/post tool hook objects, in order.
            observers: observer objects, in order.
            middleware: middleware layers; the first is the outermost.
            reflector: judges failures for recovery (default: ``NoopReflector``, no retries).
            circuit_breaker: a ``CircuitBreaker`` configuration, or ``None``.
            memory: whether successful calls write trajectory memory.
            access: an ``AccessConfig``, or ``None`` for no gate.
            database_url: the audit database; ``None`` means the embedded SQLite file.
            scratch_base: where session scratch directories go (default: the temp dir).
            managed_scratch: ``False`` gives tools the system temp dir instead.
        """
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.hooks = list(hooks)
        self.observers = list(observers)
        self.middleware = list(middleware)
        self.reflector: Reflector = reflector or NoopReflector()
        self.circuit_breaker = circuit_breaker
        self.memory = memory
        self.access = access
        self.database_url = database_url
        self.scratch_base = scratch_base
        self.managed_scratch = managed_scratch

    @classmethod
    def coerce(cls, value: Host | ToolRegistry | Iterable[Tool]) -> Host:
        """Accept a ``Host``, a ``ToolRegistry`` or a list of tools."""
        return value if isinstance(value, Host) else cls(value)

    def tool_meta(self) -> dict[str, ToolMeta]:
        """Return what the workflow needs to know of each tool."""
        return {
            item.name: ToolMeta(
                timeout_s=item.timeout_s, retry_on_interrupt=item.retry_on_interrupt
            )
            for item in self.registry
        }
