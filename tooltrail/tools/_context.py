"""The context a tool body may receive: ``ToolContext``."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ToolContext"]


@dataclass(frozen=True)
class ToolContext:
    """What a tool body may know about the call it serves.

    Declare a parameter annotated ``ToolContext`` to receive it; it stays out of the schema.
    """

    session_id: str
    """The session's id."""
    turn_id: str
    """The turn (workflow id)."""
    tool_call_id: str
    """The model-issued call id."""
    attempt: int
    """The 0-based recovery attempt."""
    temp_dir: Path
    """The session's scratch directory; it exists when the body starts."""
    principal: Any = None
    """On whose behalf the worker acts (from host wiring only; read-only)."""
    idempotency_key: str | None = None
    """The call's idempotency key, for idempotent tools."""
    cwd: str = "."
    is_non_interactive: bool = False
    user_context: Mapping[str, Any] = field(default_factory=dict)
    extensions: Mapping[str, Any] = field(default_factory=dict)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the turn asked this attempt to stop.

        Sync tools cannot be interrupted and should poll this; async tools get
        ``asyncio.CancelledError`` at their next ``await`` instead.
        """
        return self._cancel.is_set()
