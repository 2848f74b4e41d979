"""Exceptions raised by tooltrail.

The tree::

    TooltrailError                    base of everything tooltrail raises on purpose
    ├── TurnError                     a turn ended with a hard error (raised by the client)
    │   ├── LoopDetected              the loop detector stopped the turn
    │   ├── ToolRecoveryExhausted     a call hit MAX_RECOVERY_ATTEMPTS
    │   ├── TurnCancelled             the turn workflow was cancelled
    │   └── TurnFailed                any other failure of the turn workflow
    ├── ToolDefinitionError (ValueError)   a tool cannot be registered as declared
    │   └── DuplicateToolError             two tools share a name
    ├── RegistryFrozenError           a registry was changed after a worker was built on it
    ├── DatabaseSchemaError           the audit database is not migrated to the code's head
    └── ConfigurationError            settings or host wiring that cannot work
        └── ApprovalRejected          a turn refused an approval; the call keeps waiting

``ToolError`` is not in the tree on purpose: tools raise it to report an *expected* failure,
which becomes a soft result the model reads; it never escapes a turn.

This module is pure (no I/O) so workflow code may import it.
"""

from __future__ import annotations

__all__ = [
    "ApprovalRejected",
    "ConfigurationError",
    "DatabaseSchemaError",
    "DuplicateToolError",
    "LoopDetected",
    "RegistryFrozenError",
    "ToolDefinitionError",
    "ToolError",
    "ToolRecoveryExhausted",
    "TooltrailError",
    "TurnCancelled",
    "TurnError",
    "TurnFailed",
]


class ToolError(Exception):
    """Raised by a tool body for an expected failure.

    The call's result is a soft error whose output is ``str(err)``, verbatim.
    """


class TooltrailError(Exception):
    """Base class of the errors tooltrail raises."""


class TurnError(TooltrailError):
    """A turn ended with a hard error; raised by ``run_turn`` and ``TurnHandle.result``."""

    def __init__(self, message: str, *, turn_id: str | None = None) -> None:
        """Create the error.

        Args:
            message: what happened.
            turn_id: the turn (workflow id) that failed, when known.
        """
        super().__init__(message)
        self.turn_id = turn_id


class LoopDetected(TurnError):
    """Raised when the loop detector refuses a dispatch at the stop threshold."""

    def __init__(self, message: str, *, turn_id: str | None = None) -> None:
        """Create the error.

        Args:
            message: the detector's message, ``{tool}({param}) repeated {n} times``.
            turn_id: the turn that was stopped.
        """
        super().__init__(f"Loop detected: {message}", turn_id=turn_id)
        self.message = message


class ToolRecoveryExhausted(TurnError):
    """Raised when a call needed more than ``MAX_RECOVERY_ATTEMPTS`` retries."""

    def __init__(self, tool: str, attempts: int, *, turn_id: str | None = None) -> None:
        """Create the error.

        Args:
            tool: the originally requested tool name.
            attempts: total executions of the call.
            turn_id: the turn that failed.
        """
        super().__init__(
            f"tool {tool!r} recovery exhausted after {attempts} attempts", turn_id=turn_id
        )
        self.tool = tool
        self.attempts = attempts


class TurnCancelled(TurnError):
    """Raised when the turn workflow was cancelled (by the client, the CLI or Temporal's UI)."""

    def __init__(self, message: str = "turn cancelled", *, turn_id: str | None = None) -> None:
        """Create the error.

        Args:
            message: what happened.
            turn_id: the cancelled turn.
        """
        super().__init__(message, turn_id=turn_id)


class TurnFailed(TurnError):
    """Raised when a turn workflow failed for a reason other than the three hard errors.

    This means an infrastructure or programming fault (for example a workflow timeout), never
    a tool's own failure, which is always a soft result.
    """


class ToolDefinitionError(TooltrailError, ValueError):
    """Raised at registration when a tool's declaration cannot work (bad name, bad signature)."""


class DuplicateToolError(ToolDefinitionError):
    """Raised by ``ToolRegistry.register`` when the name is already taken."""


class RegistryFrozenError(TooltrailError):
    """Raised when a tool is registered after a worker was built on the registry."""


class DatabaseSchemaError(TooltrailError):
    """Raised when the audit database is missing tables or not at the migrations' head."""


class ConfigurationError(TooltrailError):
    """Raised for settings or host wiring that cannot work, with what to change."""


class ApprovalRejected(ConfigurationError):
    """Raised when a turn refuses an approval (forged, replayed, expired, misdirected...).

    The call keeps waiting. ``reason`` is the turn's; the refusal is recorded in the
    ``approval_rejection`` table when the client has the audit database.
    """

    def __init__(self, reason: str) -> None:
        """Carry the turn's reason."""
        super().__init__(reason)
        self.reason = reason
