"""Host wiring: what a worker runs with (tools, hooks, observers, ...), never from request data."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tooltrail.core.breaker import CircuitBreaker
from tooltrail.core.memoize import MemoizingMiddleware
from tooltrail.core.messages import ModelClient
from tooltrail.core.planner import CallVerdict
from tooltrail.core.proofs import WORKER_KEY_MIN_BYTES
from tooltrail.core.recovery import NoopReflector, Reflector
from tooltrail.core.results import ToolCall
from tooltrail.core.signatures import decode_public_key
from tooltrail.core.text import text_nesting_exceeds
from tooltrail.core.wire import ToolMeta
from tooltrail.errors import ConfigurationError
from tooltrail.settings import Settings
from tooltrail.tools import Tool, ToolRegistry
from tooltrail.tools.access import AccessConfig

__all__ = ["Host"]

log = logging.getLogger("tooltrail.host")


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
        circuit_breaker: CircuitBreaker | None = None,
        memory: bool = True,
        access: AccessConfig | None = None,
        database_url: str | None = None,
        scratch_base: Path | None = None,
        managed_scratch: bool = True,
        hook_timeout_s: float = 30.0,
        model: ModelClient | None = None,
        approvers: Mapping[str, str] | None = None,
        worker_keys: Mapping[str, bytes] | None = None,
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
            hook_timeout_s: how long one hook call may take before it counts as an error.
            model: the model client of agent runs (``OpenAIChatClient``,
                ``AnthropicMessagesClient``, ``ScriptedModel``...), or ``None``.
            approvers: approvers whose signed approvals the turns accept, name to base64
                Ed25519 public key; ``None`` takes them from the settings
                (``TOOLTRAIL_APPROVERS``, ``TOOLTRAIL_APPROVERS_FILE``), ``{}`` means none.
            worker_keys: the workers' shared HMAC keys by id, the first makes proofs
                (``tooltrail.core.proofs``); ``None`` takes them from the settings
                (``TOOLTRAIL_WORKER_KEY``, ``TOOLTRAIL_WORKER_KEY_FILE``).

        Raises:
            ConfigurationError: an approver's key is not a base64 Ed25519 public key.
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
        self.hook_timeout_s = hook_timeout_s
        self.model = model
        self.approvers: dict[str, str] | None = None
        if approvers is not None:
            self.approvers = {}
            for name, key in approvers.items():
                try:
                    if not name:
                        raise ValueError("an approver needs a name")
                    decode_public_key(key)
                except ValueError as exc:
                    raise ConfigurationError(f"approver {name!r}: {exc}") from None
                self.approvers[name] = key.strip()
        self.worker_keys: dict[str, bytes] | None = None
        if worker_keys is not None:
            self.worker_keys = dict(worker_keys)
            for kid, secret in self.worker_keys.items():
                if not kid or "." in kid or len(secret) < WORKER_KEY_MIN_BYTES:
                    raise ConfigurationError(
                        f"worker key {kid!r}: an id without '.' and at least "
                        f"{WORKER_KEY_MIN_BYTES} bytes are needed"
                    )

    @classmethod
    def coerce(cls, value: Host | ToolRegistry | Iterable[Tool]) -> Host:
        """Accept a ``Host``, a ``ToolRegistry`` or a list of tools."""
        return value if isinstance(value, Host) else cls(value)

    def approver_keys(self) -> dict[str, str]:
        """The approvers the worker's turns accept: the wiring's, or else the settings'.

        Raises:
            ConfigurationError: the settings name approvers that cannot be used.
        """
        if self.approvers is not None:
            return dict(self.approvers)
        return Settings().approver_keys()

    def worker_key_ring(self) -> dict[str, bytes]:
        """The worker keys: the wiring's, or else the settings' (empty: none).

        Raises:
            ConfigurationError: the settings name a key that cannot be used.
        """
        if self.worker_keys is not None:
            return dict(self.worker_keys)
        return Settings().worker_key_ring()

    def verdicts(self, calls: Sequence[ToolCall]) -> list[CallVerdict]:
        """Evaluate each tool's concurrency declaration on its call's arguments.

        Unknown tools, unparseable arguments and declarations that raise give an unsafe
        verdict: a wrong "unsafe" costs speed, a wrong "safe" could corrupt data.
        """
        verdicts = []
        for call in calls:
            item = self.registry.lookup(call.name)
            arguments: Any = call.arguments
            if isinstance(arguments, str):
                try:
                    # Text nested too deep is refused by the turn: not parsed here either
                    # (Python's parser gives up at about a thousand levels).
                    if text_nesting_exceeds(arguments):
                        arguments = None
                    else:
                        arguments = json.loads(arguments) if arguments.strip() else {}
                except (ValueError, RecursionError):
                    arguments = None
            if item is None or not isinstance(arguments, dict):
                verdicts.append(CallVerdict())
                continue
            try:
                safe = item.is_safe_for(arguments)
                key = item.key_for(arguments) if safe else None
            except Exception:
                log.warning("concurrency declaration of %r raised; running it alone", call.name)
                safe, key = False, None
            verdicts.append(CallVerdict(safe=safe, key=key))
        return verdicts

    def memoizer(self) -> MemoizingMiddleware | None:
        """The host's ``MemoizingMiddleware``, if one is installed."""
        return next((m for m in self.middleware if isinstance(m, MemoizingMiddleware)), None)

    def tool_meta(self) -> dict[str, ToolMeta]:
        """Return what the workflow needs to know of each tool."""
        return {
            item.name: ToolMeta(
                timeout_s=item.timeout_s,
                retry_on_interrupt=item.retry_on_interrupt,
                local=item.local,
                loop_threshold=getattr(item, "loop_thresholds", None),
                primary_param=getattr(item, "primary_param", None),
                loop_suggestion=getattr(item, "loop_suggestion", None),
            )
            for item in self.registry
        }
