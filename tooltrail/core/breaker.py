"""Circuit breakers per tool (pipeline spec §11): the configuration and a pure state machine.

The state machine is a set of pure functions over a frozen ``BreakerState`` that take the
current time as an argument, so every rule of the spec's table (§11.2) can be tested without
a clock or a database. Where the breakers live (one shared row per tool, so every worker
agrees) is the database layer's business: ``tooltrail.db.health.HealthStore`` reads a row,
applies one of these functions and writes the row back; this module imports no SQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BreakerState",
    "BreakerStatus",
    "CircuitBreaker",
    "CircuitBreakerConfig",
    "Health",
    "allow_request",
    "initial_state",
    "is_tool_available",
    "lease_live",
    "record_failure",
    "record_success",
    "would_allow_request",
]

BreakerStatus = Literal["closed", "open", "half_open"]
"""The state of a breaker, as stored in ``tool_health.state``."""

EWMA_SCALE = 1_000_000
"""Fixed-point scale of ``ewma_micros``."""


class CircuitBreaker(BaseModel):
    """Configuration of the per-tool circuit breakers (the spec's ``CircuitBreakerConfig``).

    A breaker's configuration is frozen into its row when the breaker is created, so a
    changed configuration only affects breakers created after the change.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    failure_threshold: int = Field(default=3, ge=0)
    """Consecutive failures that trip a Closed breaker; ``0`` never trips but still counts."""
    recovery_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """The cooldown: how long an Open breaker refuses calls before granting one probe."""
    probe_timeout_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """How long a granted probe holds the breaker HalfOpen before another may be granted.

    ``None`` means the same as ``recovery_s``; ``0`` disables the lease (a probe never
    expires, so the breaker waits for its outcome however long it takes).
    """

    @property
    def recovery_ms(self) -> int:
        """The cooldown in whole milliseconds, as stored in a breaker's row."""
        return round(self.recovery_s * 1000)

    @property
    def probe_timeout_ms(self) -> int:
        """The probe lease in whole milliseconds (``0``: no lease), as stored in a row."""
        seconds = self.recovery_s if self.probe_timeout_s is None else self.probe_timeout_s
        return round(seconds * 1000)


CircuitBreakerConfig = CircuitBreaker
"""The spec's name for ``CircuitBreaker``."""


class Health(StrEnum):
    """A telemetry label derived from a breaker's score; it never blocks a call."""

    HEALTHY = "healthy"
    """Score at least 0.8 and the breaker is not Open."""
    DEGRADED = "degraded"
    """Score at least 0.5 and the breaker is not Open."""
    UNHEALTHY = "unhealthy"
    """Score below 0.5, or the breaker is Open."""


class BreakerState(BaseModel):
    """One tool's breaker: its state machine, its frozen configuration and its telemetry.

    Times are timezone-aware UTC (the database server's clock).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: BreakerStatus = "closed"
    consecutive_failures: int = 0
    """Failures since the last success that closed the breaker."""
    last_failure_at: datetime | None = None
    """When the cooldown started: the last failure, or the end of an expired probe lease."""
    probe_started_at: datetime | None = None
    """When the HalfOpen probe was granted; ``None`` outside HalfOpen."""
    failure_threshold: int = 3
    recovery_ms: int = 30_000
    probe_timeout_ms: int = 30_000
    successes: int = 0
    """Every success recorded, including those the state machine ignores."""
    failures: int = 0
    """Every failure recorded."""
    ewma_micros: int = EWMA_SCALE
    """Exponentially weighted success rate, fixed point x1,000,000; starts at 1.0."""
    last_duration_ms: float | None = None
    """Duration of the last recorded attempt."""

    @property
    def ewma(self) -> float:
        """The exponentially weighted success rate, in [0, 1]."""
        return self.ewma_micros / EWMA_SCALE

    @property
    def success_rate(self) -> float:
        """Successes over all recorded outcomes; ``1.0`` before any outcome."""
        total = self.successes + self.failures
        return 1.0 if total == 0 else self.successes / total

    @property
    def score(self) -> float:
        """``0.3 * success_rate + 0.7 * ewma`` (telemetry only)."""
        return 0.3 * self.success_rate + 0.7 * self.ewma

    @property
    def health(self) -> Health:
        """Healthy at a score of 0.8 or more, Degraded at 0.5 or more; Open is Unhealthy."""
        if self.state == "open":
            return Health.UNHEALTHY
        if self._score_at_least(8):
            return Health.HEALTHY
        if self._score_at_least(5):
            return Health.DEGRADED
        return Health.UNHEALTHY

    def _score_at_least(self, tenths: int) -> bool:
        # Exact integer comparison of 0.3*s/n + 0.7*e/SCALE >= tenths/10, so a score that is
        # exactly on a boundary is not pushed below it by float rounding.
        successes, total = self.successes, self.successes + self.failures
        if total == 0:
            successes, total = 1, 1
        lhs = 3 * successes * EWMA_SCALE + 7 * self.ewma_micros * total
        return lhs >= tenths * EWMA_SCALE * total


def initial_state(config: CircuitBreaker) -> BreakerState:
    """Return a new, Closed breaker with ``config`` frozen into it."""
    return BreakerState(
        failure_threshold=config.failure_threshold,
        recovery_ms=config.recovery_ms,
        probe_timeout_ms=config.probe_timeout_ms,
    )


# -- the pure state machine (spec §11.2) ------------------------------------------------------


def _probe_timeout(state: BreakerState) -> timedelta:
    return timedelta(milliseconds=state.probe_timeout_ms)


def lease_live(state: BreakerState, now: datetime) -> bool:
    """Whether a HalfOpen breaker's probe lease is live at ``now``.

    A lease is live while ``probe_timeout == 0`` or ``now - probe_started < probe_timeout``.
    """
    if state.probe_timeout_ms == 0:
        return True
    if state.probe_started_at is None:
        return False
    return now - state.probe_started_at < _probe_timeout(state)


def _expire_lease(state: BreakerState, now: datetime) -> BreakerState:
    # Back to Open with the cooldown re-armed from the end of the lease, not from now: the
    # probe that never reported is treated as a failure at the moment its lease ran out.
    lease_end = (
        now if state.probe_started_at is None else state.probe_started_at + _probe_timeout(state)
    )
    return state.model_copy(
        update={"state": "open", "last_failure_at": lease_end, "probe_started_at": None}
    )


def allow_request(state: BreakerState, now: datetime) -> tuple[BreakerState, bool]:
    """The gate: whether a call may run now, and the breaker's state after asking.

    Closed: allowed. Open: once ``now - last_failure >= recovery``, the breaker moves to
    HalfOpen with ``probe_started = now`` and this call is the probe; before that, refused.
    HalfOpen with a live lease: refused (one probe at a time). HalfOpen with an expired
    lease: back to Open with ``last_failure`` at the lease end, then the Open rule applies in
    the same call.

    Args:
        state: the breaker before the call.
        now: the current time (timezone-aware).

    Returns:
        The breaker's new state and whether the call may run.
    """
    if state.state == "closed":
        return state, True
    if state.state == "half_open":
        if lease_live(state, now):
            return state, False
        state = _expire_lease(state, now)
    cooldown = timedelta(milliseconds=state.recovery_ms)
    if state.last_failure_at is None or now - state.last_failure_at >= cooldown:
        return state.model_copy(update={"state": "half_open", "probe_started_at": now}), True
    return state, False


def would_allow_request(state: BreakerState, now: datetime) -> bool:
    """Whether ``allow_request`` would allow a call at ``now``, without consuming the probe."""
    return allow_request(state, now)[1]


is_tool_available = would_allow_request
"""The spec's other name for ``would_allow_request``."""


def _telemetry(state: BreakerState, *, success: bool, duration_ms: float) -> dict[str, Any]:
    sample = EWMA_SCALE if success else 0
    # 0.7 * ewma + 0.3 * sample in integer fixed point, rounded half up.
    ewma = (7 * state.ewma_micros + 3 * sample + 5) // 10
    return {
        "successes": state.successes + int(success),
        "failures": state.failures + int(not success),
        "ewma_micros": ewma,
        "last_duration_ms": duration_ms,
    }


def record_failure(state: BreakerState, now: datetime, duration_ms: float) -> BreakerState:
    """Record a failed attempt.

    ``consecutive += 1``, ``last_failure = now``, the probe is cleared. A Closed breaker
    with ``threshold > 0`` and ``consecutive >= threshold`` opens; a HalfOpen breaker opens
    (the probe failed); an Open breaker stays Open and its cooldown restarts.

    Args:
        state: the breaker before the outcome.
        now: the current time (timezone-aware).
        duration_ms: how long the attempt took.

    Returns:
        The breaker after the outcome.
    """
    consecutive = state.consecutive_failures + 1
    trips = state.state != "closed" or 0 < state.failure_threshold <= consecutive
    return state.model_copy(
        update={
            "state": "open" if trips else "closed",
            "consecutive_failures": consecutive,
            "last_failure_at": now,
            "probe_started_at": None,
            **_telemetry(state, success=False, duration_ms=duration_ms),
        }
    )


def record_success(state: BreakerState, now: datetime, duration_ms: float) -> BreakerState:
    """Record a successful attempt.

    An Open breaker ignores it (a stale success from before the trip). A HalfOpen breaker
    whose lease expired moves to Open with the cooldown re-armed from the lease end and
    ignores it too. Otherwise ``consecutive = 0``, the probe is cleared and the breaker is
    Closed. The success always counts in the telemetry (counters and EWMA).

    Args:
        state: the breaker before the outcome.
        now: the current time (timezone-aware).
        duration_ms: how long the attempt took.

    Returns:
        The breaker after the outcome.
    """
    counted = state.model_copy(update=_telemetry(state, success=True, duration_ms=duration_ms))
    if state.state == "open":
        return counted
    if state.state == "half_open" and not lease_live(state, now):
        return _expire_lease(counted, now)
    return counted.model_copy(
        update={"state": "closed", "consecutive_failures": 0, "probe_started_at": None}
    )
