"""tooltrail: durable, auditable tool calls for LLM agents, on Temporal and SQL.

Importing this package has no side effects and loads nothing but this file: every public
name is imported from its module on first use (PEP 562). So the pure modules (what workflow
code imports) never drag in the client, the worker or the database layer, and any module
imports on its own in a fresh interpreter. No server starts and no database opens until a
client or worker is created.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tooltrail.access import (
        AccessConfig,
        AccessDecision,
        AccessGate,
        AccessRequest,
        AuthorityScope,
        Principal,
        ScopeGate,
        Subject,
    )
    from tooltrail.breaker import CircuitBreaker
    from tooltrail.client import Tooltrail, TurnHandle, TurnResult, connect, local
    from tooltrail.config import LoopDetection, RunConfig
    from tooltrail.errors import (
        ConfigurationError,
        DatabaseSchemaError,
        DuplicateToolError,
        LoopDetected,
        RegistryFrozenError,
        ToolDefinitionError,
        ToolError,
        ToolRecoveryExhausted,
        TooltrailError,
        TurnCancelled,
        TurnError,
        TurnFailed,
    )
    from tooltrail.guards import Guard, GuardrailViolation, InputGuard, ToolDefaults, tool_defaults
    from tooltrail.hooks import (
        Allow,
        Ask,
        Block,
        PostToolHook,
        PostToolUseContext,
        PreToolHook,
        PreToolUseContext,
    )
    from tooltrail.host import Host
    from tooltrail.idempotency import CachedToolError, Idempotency, derive_key
    from tooltrail.memoize import MemoizingMiddleware
    from tooltrail.middleware import (
        MiddlewareCall,
        OutputLimitMiddleware,
        PermissionAllow,
        PermissionAsk,
        PermissionDecision,
        PermissionDeny,
        PermissionMiddleware,
        PermissionModify,
        RedactingMiddleware,
        TimeoutMiddleware,
        UnknownToolMiddleware,
        VerifyMiddleware,
    )
    from tooltrail.observers import ObservedEvent
    from tooltrail.recovery import (
        MAX_RECOVERY_ATTEMPTS,
        AlwaysRecoverable,
        Analysis,
        ExponentialBackoff,
        FixedDelay,
        InputFix,
        NoopReflector,
        NoRetry,
        ReflectionContext,
        Reflector,
        RetryForever,
        ToolChange,
    )
    from tooltrail.results import (
        ImagePart,
        Part,
        TextPart,
        ToolCall,
        ToolDispatchResult,
        ToolOutput,
    )
    from tooltrail.tools import (
        DynamicTool,
        Snapshot,
        Tool,
        ToolContext,
        ToolRegistry,
        ToolSpec,
        UnknownToolError,
        tool,
    )
    from tooltrail.wire import AuditEvent, MemoryEntry
    from tooltrail.worker import build_worker, worker


_MODULE_OF: dict[str, str] = {
    "AccessConfig": "tooltrail.access",
    "AccessDecision": "tooltrail.access",
    "AccessGate": "tooltrail.access",
    "AccessRequest": "tooltrail.access",
    "AuthorityScope": "tooltrail.access",
    "Principal": "tooltrail.access",
    "ScopeGate": "tooltrail.access",
    "Subject": "tooltrail.access",
    "CircuitBreaker": "tooltrail.breaker",
    "Tooltrail": "tooltrail.client",
    "TurnHandle": "tooltrail.client",
    "TurnResult": "tooltrail.client",
    "connect": "tooltrail.client",
    "local": "tooltrail.client",
    "LoopDetection": "tooltrail.config",
    "RunConfig": "tooltrail.config",
    "ConfigurationError": "tooltrail.errors",
    "DatabaseSchemaError": "tooltrail.errors",
    "DuplicateToolError": "tooltrail.errors",
    "LoopDetected": "tooltrail.errors",
    "RegistryFrozenError": "tooltrail.errors",
    "ToolDefinitionError": "tooltrail.errors",
    "ToolError": "tooltrail.errors",
    "ToolRecoveryExhausted": "tooltrail.errors",
    "TooltrailError": "tooltrail.errors",
    "TurnCancelled": "tooltrail.errors",
    "TurnError": "tooltrail.errors",
    "TurnFailed": "tooltrail.errors",
    "Guard": "tooltrail.guards",
    "GuardrailViolation": "tooltrail.guards",
    "InputGuard": "tooltrail.guards",
    "ToolDefaults": "tooltrail.guards",
    "tool_defaults": "tooltrail.guards",
    "Allow": "tooltrail.hooks",
    "Ask": "tooltrail.hooks",
    "Block": "tooltrail.hooks",
    "PostToolHook": "tooltrail.hooks",
    "PostToolUseContext": "tooltrail.hooks",
    "PreToolHook": "tooltrail.hooks",
    "PreToolUseContext": "tooltrail.hooks",
    "Host": "tooltrail.host",
    "CachedToolError": "tooltrail.idempotency",
    "Idempotency": "tooltrail.idempotency",
    "derive_key": "tooltrail.idempotency",
    "MemoizingMiddleware": "tooltrail.memoize",
    "OutputLimitMiddleware": "tooltrail.middleware",
    "PermissionMiddleware": "tooltrail.middleware",
    "MiddlewareCall": "tooltrail.middleware",
    "PermissionAllow": "tooltrail.middleware",
    "PermissionAsk": "tooltrail.middleware",
    "PermissionDecision": "tooltrail.middleware",
    "PermissionDeny": "tooltrail.middleware",
    "PermissionModify": "tooltrail.middleware",
    "RedactingMiddleware": "tooltrail.middleware",
    "TimeoutMiddleware": "tooltrail.middleware",
    "UnknownToolMiddleware": "tooltrail.middleware",
    "VerifyMiddleware": "tooltrail.middleware",
    "ObservedEvent": "tooltrail.observers",
    "AlwaysRecoverable": "tooltrail.recovery",
    "Analysis": "tooltrail.recovery",
    "ExponentialBackoff": "tooltrail.recovery",
    "FixedDelay": "tooltrail.recovery",
    "InputFix": "tooltrail.recovery",
    "MAX_RECOVERY_ATTEMPTS": "tooltrail.recovery",
    "NoRetry": "tooltrail.recovery",
    "NoopReflector": "tooltrail.recovery",
    "ReflectionContext": "tooltrail.recovery",
    "Reflector": "tooltrail.recovery",
    "RetryForever": "tooltrail.recovery",
    "ToolChange": "tooltrail.recovery",
    "ImagePart": "tooltrail.results",
    "Part": "tooltrail.results",
    "TextPart": "tooltrail.results",
    "ToolCall": "tooltrail.results",
    "ToolDispatchResult": "tooltrail.results",
    "ToolOutput": "tooltrail.results",
    "DynamicTool": "tooltrail.tools",
    "Snapshot": "tooltrail.tools",
    "Tool": "tooltrail.tools",
    "ToolContext": "tooltrail.tools",
    "ToolRegistry": "tooltrail.tools",
    "ToolSpec": "tooltrail.tools",
    "UnknownToolError": "tooltrail.tools",
    "tool": "tooltrail.tools",
    "AuditEvent": "tooltrail.wire",
    "MemoryEntry": "tooltrail.wire",
    "build_worker": "tooltrail.worker",
    "worker": "tooltrail.worker",
}
"""Where each public name lives."""


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'tooltrail' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "MAX_RECOVERY_ATTEMPTS",
    "AccessConfig",
    "AccessDecision",
    "AccessGate",
    "AccessRequest",
    "Allow",
    "AlwaysRecoverable",
    "Analysis",
    "Ask",
    "AuditEvent",
    "AuthorityScope",
    "Block",
    "CachedToolError",
    "CircuitBreaker",
    "ConfigurationError",
    "DatabaseSchemaError",
    "DuplicateToolError",
    "DynamicTool",
    "ExponentialBackoff",
    "FixedDelay",
    "Guard",
    "GuardrailViolation",
    "Host",
    "Idempotency",
    "ImagePart",
    "InputFix",
    "InputGuard",
    "LoopDetected",
    "LoopDetection",
    "MemoizingMiddleware",
    "MemoryEntry",
    "MiddlewareCall",
    "NoRetry",
    "NoopReflector",
    "ObservedEvent",
    "OutputLimitMiddleware",
    "Part",
    "PermissionAllow",
    "PermissionAsk",
    "PermissionDecision",
    "PermissionDeny",
    "PermissionMiddleware",
    "PermissionModify",
    "PostToolHook",
    "PostToolUseContext",
    "PreToolHook",
    "PreToolUseContext",
    "Principal",
    "RedactingMiddleware",
    "ReflectionContext",
    "Reflector",
    "RegistryFrozenError",
    "RetryForever",
    "RunConfig",
    "ScopeGate",
    "Snapshot",
    "Subject",
    "TextPart",
    "TimeoutMiddleware",
    "Tool",
    "ToolCall",
    "ToolChange",
    "ToolContext",
    "ToolDefaults",
    "ToolDefinitionError",
    "ToolDispatchResult",
    "ToolError",
    "ToolOutput",
    "ToolRecoveryExhausted",
    "ToolRegistry",
    "ToolSpec",
    "Tooltrail",
    "TooltrailError",
    "TurnCancelled",
    "TurnError",
    "TurnFailed",
    "TurnHandle",
    "TurnResult",
    "UnknownToolError",
    "UnknownToolMiddleware",
    "VerifyMiddleware",
    "build_worker",
    "connect",
    "derive_key",
    "local",
    "tool",
    "tool_defaults",
    "worker",
]
