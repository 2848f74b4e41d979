"""Per-turn configuration (``RunConfig``), carried in workflow input. Pure module."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from tooltrail.core.recovery import ExponentialBackoff, RecoveryStrategy, as_strategy

__all__ = ["INLINE_OUTPUT_BYTES", "LARGE_OUTPUT_BYTES", "MAX_CALLS", "LoopDetection", "RunConfig"]

LARGE_OUTPUT_BYTES = 256 * 1024
"""Default of ``RunConfig.large_output_bytes``."""
MAX_CALLS = 1000
"""Default of ``RunConfig.max_calls``."""
INLINE_OUTPUT_BYTES = 512 * 1024
"""Default of ``RunConfig.inline_output_bytes``: an agent turn's last write carries its
outputs twice (trail and conversation), and that must stay well under 2 MiB."""


class LoopDetection(BaseModel):
    """Loop-detection settings (the pipeline spec's ``DetectionConfig``)."""

    loop_threshold: int = Field(default=3, ge=1)
    """A repetition count at or above this is a pattern."""
    stop_threshold: int = Field(default=10, ge=0)
    """A count at or above this stops the turn; 0 disables hard stops."""
    window: int = Field(default=100, ge=1)
    """Operations remembered per session (the spec's ``max_history``)."""
    enabled: bool = True
    """Whether detection runs at all."""


class RunConfig(BaseModel):
    """How one turn dispatches its calls."""

    dispatch: Literal["sequential", "parallel"] = "sequential"
    """Sequential (default) or parallel waves."""
    max_concurrency: int = Field(default=8, ge=1)
    """Upper bound of concurrently running calls in parallel mode."""
    recovery: RecoveryStrategy = Field(default_factory=ExponentialBackoff)
    """What to do after a failed attempt the reflector judged: a built-in strategy, or any
    object with a deterministic ``decide(analysis, attempt, max_attempts)`` (workflow code,
    see ``tooltrail.core.recovery.Strategy``), carried as a ``CustomStrategy``."""
    detection: LoopDetection = Field(default_factory=LoopDetection)
    """Loop detection."""
    tool_timeout_s: float = Field(default=600.0, gt=0)
    """Temporal start-to-close timeout of one tool attempt, for tools without ``timeout_s``."""
    heartbeat_timeout_s: float = Field(default=10.0, gt=0)
    """Temporal heartbeat timeout of a tool attempt: how fast a lost worker is noticed."""
    infrastructure_retries: int = Field(default=5, ge=1)
    """Temporal attempts of one tool attempt after infrastructure failures (lost worker)."""
    max_calls: int = Field(default=MAX_CALLS, ge=1)
    """Tool calls one turn accepts. A turn with more is refused before anything runs (the
    client raises; an agent turn answers every call with the error text), since each call
    adds events to the turn's history and Temporal terminates a turn past ~50,000."""
    max_argument_bytes: int = Field(default=512 * 1024, gt=0)
    """A call whose arguments are larger is answered with a soft error and never dispatched:
    Temporal refuses payloads over 2 MiB, and a refused command would stall the turn."""
    large_output_bytes: int = Field(default=LARGE_OUTPUT_BYTES, ge=0)
    """Outputs above this size stay out of workflow history: the database keeps them and
    the history carries a reference (0 disables)."""
    inline_output_bytes: int = Field(default=INLINE_OUTPUT_BYTES, ge=0)
    """Bytes of tool output one turn keeps in its workflow history, all calls together.
    Past it every further output goes to the database as a large one does, whatever its
    size: a turn's outputs travel together in its last trail record and its result, and
    Temporal refuses payloads over 2 MiB (0 sends every output to the database)."""
    interactive: bool = False
    """A hook's ``Ask`` waits for a human's approval (a Temporal Update) instead of refusing."""
    approval_timeout_s: float = Field(default=3600.0, gt=0)
    """How long an interactive ``Ask`` waits before falling back to the headless refusal."""
    audit_interval_s: float = Field(default=2.0, ge=0)
    """How stale the audit trail of a running turn may get. The workflow keeps its records
    and writes them in batches (a local activity, so they never enter the workflow history):
    before a tool call once this many seconds passed since the last write, before every
    backoff timer and approval wait, and at the end of the turn. 0 writes them before every
    tool call, for observers that must hear of each call as it starts."""

    @field_validator("recovery", mode="before")
    @classmethod
    def _open_strategies(cls, value: Any) -> Any:
        # Any object with decide() is accepted; the wire carries it as a CustomStrategy.
        return as_strategy(value)
