"""The public surface: ``tooltrail.__all__`` is pinned, and holds every name of the contract.

A name may be added to the surface (then it is added here too, on purpose); none is renamed or
removed. The order is the one ruff keeps ``__all__`` in (RUF022: constants, classes, then
functions, each alphabetical).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import tooltrail

PUBLIC = [
    "MAX_RECOVERY_ATTEMPTS",
    "AccessConfig",
    "AccessDecision",
    "AccessGate",
    "AccessRequest",
    "Allow",
    "AlwaysRecoverable",
    "Analysis",
    "ApproachChange",
    "ApprovalRejected",
    "Ask",
    "AskUser",
    "AuditEvent",
    "AuthorityScope",
    "Block",
    "CachedToolError",
    "CircuitBreaker",
    "ConfigurationError",
    "CustomStrategy",
    "DatabaseSchemaError",
    "DuplicateToolError",
    "DynamicTool",
    "Escalate",
    "ExponentialBackoff",
    "Fail",
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
    "PrerequisiteFix",
    "Principal",
    "RedactingMiddleware",
    "ReflectionContext",
    "Reflector",
    "RegistryFrozenError",
    "Retry",
    "RetryForever",
    "RunConfig",
    "SafetyShieldMiddleware",
    "ScopeGate",
    "Skip",
    "Snapshot",
    "Strategy",
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

# Every name the team's CONTRACT.md (the public surface users program against) shows, each of
# which it promises importable from the top-level package: ``from tooltrail import ...``.
CONTRACT_NAMES = frozenset(
    {
        "AccessConfig",
        "AccessDecision",
        "Allow",
        "AlwaysRecoverable",
        "Analysis",
        "Ask",
        "AuditEvent",
        "AuthorityScope",
        "Block",
        "CircuitBreaker",
        "ExponentialBackoff",
        "FixedDelay",
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
        "OutputLimitMiddleware",
        "Part",
        "PermissionMiddleware",
        # The decisions a PermissionMiddleware policy returns, and what it is given (issue 21).
        "MiddlewareCall",
        "PermissionAllow",
        "PermissionAsk",
        "PermissionDecision",
        "PermissionDeny",
        "PermissionModify",
        "PostToolHook",
        "PostToolUseContext",
        "PreToolHook",
        "PreToolUseContext",
        "Principal",
        "RedactingMiddleware",
        "ReflectionContext",
        "Reflector",
        "RetryForever",
        "RunConfig",
        "ScopeGate",
        "TextPart",
        "TimeoutMiddleware",
        "Tool",
        "ToolCall",
        "ToolChange",
        "ToolContext",
        "ToolDispatchResult",
        "ToolError",
        "ToolOutput",
        "ToolRecoveryExhausted",
        "ToolRegistry",
        "TooltrailError",
        "TurnCancelled",
        "UnknownToolMiddleware",
        "VerifyMiddleware",
        "connect",
        "local",
        "tool",
        "worker",
    }
)


def test_the_public_names_are_exactly_these() -> None:
    assert tooltrail.__all__ == PUBLIC


def test_the_public_names_are_listed_once_in_ruffs_order() -> None:
    def order(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
        return kind, name

    assert len(set(tooltrail.__all__)) == len(tooltrail.__all__)
    assert sorted(tooltrail.__all__, key=order) == tooltrail.__all__


def test_every_contract_name_is_public() -> None:
    assert sorted(CONTRACT_NAMES - set(tooltrail.__all__)) == []
    for name in CONTRACT_NAMES:
        assert getattr(tooltrail, name) is not None


def test_every_lazily_loaded_name_is_public() -> None:
    # A name the front door can load but does not list would be public by accident.
    assert set(tooltrail._MODULE_OF) == set(tooltrail.__all__)


# How each public function is called with the least it takes: in a fresh interpreter, after
# the modules ``local``, ``connect`` and ``build_worker`` load have loaded (they once replaced
# ``tooltrail.worker`` the function with ``tooltrail.worker`` the module).
CALLS = """
import contextlib, inspect, json
import pydantic
import tooltrail
import tooltrail.client, tooltrail.runtime.worker

def echo(text: str) -> str:
    '''Echo.'''
    return text

class Echo(pydantic.BaseModel):
    text: str

made = {}
host = tooltrail.Host()
made["worker"] = tooltrail.worker(host)
made["local"] = tooltrail.local(host)
made["connect"] = tooltrail.connect()
made["tool"] = tooltrail.tool(echo)
made["tool_defaults"] = tooltrail.tool_defaults()
made["derive_key"] = tooltrail.derive_key(
    "echo", Echo(text="hi"), policy=tooltrail.Idempotency(), principal_id="p"
)
made["build_worker"] = inspect.signature(tooltrail.build_worker).bind(
    None, host, task_queue="q", store=None
)
for name in ("worker", "local", "connect"):
    assert isinstance(made[name], contextlib.AbstractAsyncContextManager), name
classes = {}
for name in tooltrail.__all__:
    value = getattr(tooltrail, name)
    if isinstance(value, type):
        try:
            value()
            classes[name] = "instantiated"
        except (TypeError, pydantic.ValidationError):
            inspect.signature(value)
            classes[name] = "needs arguments"
print(json.dumps({"made": {k: type(v).__name__ for k, v in made.items()}, "classes": classes}))
"""


def test_every_public_function_can_be_called_after_the_worker_module_loaded() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CALLS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    functions = {name for name in tooltrail.__all__ if inspect.isfunction(getattr(tooltrail, name))}
    assert set(out["made"]) == functions
    assert out["made"]["tool"] == "Tool"
    assert out["made"]["derive_key"] == "str"
    assert "Host" in out["classes"] and "RunConfig" in out["classes"]
    assert out["classes"]["RunConfig"] == "instantiated"
