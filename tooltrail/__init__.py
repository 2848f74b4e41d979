"""tooltrail: durable, auditable tool calls for LLM agents, on Temporal and SQL.

Importing this package has no side effects: no server starts and no database opens until a
client or worker is created.
"""

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
from tooltrail.host import Host
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
from tooltrail.results import ImagePart, Part, TextPart, ToolCall, ToolDispatchResult, ToolOutput
from tooltrail.tools import Tool, ToolContext, ToolRegistry, ToolSpec, tool
from tooltrail.wire import AuditEvent, MemoryEntry
from tooltrail.worker import build_worker, worker

__all__ = [
    "MAX_RECOVERY_ATTEMPTS",
    "AlwaysRecoverable",
    "Analysis",
    "AuditEvent",
    "CircuitBreaker",
    "ConfigurationError",
    "DatabaseSchemaError",
    "DuplicateToolError",
    "ExponentialBackoff",
    "FixedDelay",
    "Host",
    "ImagePart",
    "InputFix",
    "LoopDetected",
    "LoopDetection",
    "MemoryEntry",
    "NoRetry",
    "NoopReflector",
    "Part",
    "ReflectionContext",
    "Reflector",
    "RegistryFrozenError",
    "RetryForever",
    "RunConfig",
    "TextPart",
    "Tool",
    "ToolCall",
    "ToolChange",
    "ToolContext",
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
    "build_worker",
    "connect",
    "local",
    "tool",
    "worker",
]
