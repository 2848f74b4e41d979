"""tooltrail: durable, auditable tool calls for LLM agents, on Temporal and SQL.

Importing this package has no side effects: no server starts and no database opens until a
client or worker is created.
"""

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
from tooltrail.hooks import Allow, Ask, Block, PostToolUseContext, PreToolUseContext
from tooltrail.host import Host
from tooltrail.idempotency import CachedToolError, Idempotency, derive_key
from tooltrail.memoize import MemoizingMiddleware
from tooltrail.middleware import (
    OutputLimitMiddleware,
    PermissionMiddleware,
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
from tooltrail.results import ImagePart, Part, TextPart, ToolCall, ToolDispatchResult, ToolOutput
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
    "NoRetry",
    "NoopReflector",
    "ObservedEvent",
    "OutputLimitMiddleware",
    "Part",
    "PermissionMiddleware",
    "PostToolUseContext",
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
