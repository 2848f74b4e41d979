"""Circuit breakers (pipeline spec §11): the pure state machine (``tooltrail.core.breaker``), and
its store ``tooltrail.db.health.HealthStore`` on real SQLite and PostgreSQL, including a single
probe across concurrent workers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tooltrail.core.breaker import (
    BreakerState,
    CircuitBreaker,
    CircuitBreakerConfig,
    Health,
    allow_request,
    initial_state,
    is_tool_available,
    lease_live,
    record_failure,
    record_success,
    would_allow_request,
)
from tooltrail.db.health import HealthStore
from tooltrail.db.store import AuditStore

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


def state(**overrides: object) -> BreakerState:
    """A breaker with threshold 3, cooldown 10 s, lease 5 s, then ``overrides``."""
    base = initial_state(CircuitBreaker(failure_threshold=3, recovery_s=10, probe_timeout_s=5))
    return base.model_copy(update=overrides)


OPEN = state(state="open", consecutive_failures=3, last_failure_at=T0)
HALF_OPEN = state(
    state="half_open", consecutive_failures=3, last_failure_at=T0, probe_started_at=T0 + ms(10_000)
)


# -- configuration ----------------------------------------------------------------------------


def test_config_defaults_match_the_contract() -> None:
    config = CircuitBreaker()
    assert (config.failure_threshold, config.recovery_s, config.probe_timeout_s) == (3, 30.0, None)
    assert (config.recovery_ms, config.probe_timeout_ms) == (30_000, 30_000)
    assert CircuitBreakerConfig is CircuitBreaker
    contract = CircuitBreaker(failure_threshold=3, recovery_s=30, probe_timeout_s=30)
    assert (contract.recovery_ms, contract.probe_timeout_ms) == (30_000, 30_000)


def test_probe_timeout_defaults_to_the_cooldown_and_zero_disables_it() -> None:
    assert CircuitBreaker(recovery_s=0.2).probe_timeout_ms == 200
    assert CircuitBreaker(recovery_s=7, probe_timeout_s=0).probe_timeout_ms == 0
    assert CircuitBreaker(recovery_s=7, probe_timeout_s=1.5).probe_timeout_ms == 1500


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_threshold": -1},
        {"recovery_s": -0.1},
        {"probe_timeout_s": -1},
        {"recovery_s": float("inf")},
        {"probe_timeout_s": float("nan")},
        {"recovery": 3},
    ],
)
def test_config_rejects_invalid_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CircuitBreaker(**kwargs)


def test_config_is_frozen() -> None:
    config = CircuitBreaker()
    with pytest.raises(ValidationError):
        config.failure_threshold = 5  # type: ignore[misc]


def test_initial_state_freezes_the_config() -> None:
    assert initial_state(CircuitBreaker(failure_threshold=0, recovery_s=1.25)) == BreakerState(
        state="closed",
        consecutive_failures=0,
        last_failure_at=None,
        probe_started_at=None,
        failure_threshold=0,
        recovery_ms=1250,
        probe_timeout_ms=1250,
        successes=0,
        failures=0,
        ewma_micros=1_000_000,
        last_duration_ms=None,
    )


# -- allow_request (§11.2 row 1) --------------------------------------------------------------


def test_closed_allows_and_changes_nothing() -> None:
    closed = state(consecutive_failures=2, last_failure_at=T0)
    assert allow_request(closed, T0 + ms(1)) == (closed, True)


def test_open_refuses_during_the_cooldown() -> None:
    assert allow_request(OPEN, T0) == (OPEN, False)
    assert allow_request(OPEN, T0 + ms(9_999)) == (OPEN, False)


def test_open_grants_one_probe_once_the_cooldown_has_elapsed() -> None:
    now = T0 + ms(10_000)  # exactly the cooldown: >= elapses it
    after, allowed = allow_request(OPEN, now)
    assert allowed is True
    assert after == OPEN.model_copy(update={"state": "half_open", "probe_started_at": now})


def test_half_open_with_a_live_lease_refuses() -> None:
    probe = HALF_OPEN.probe_started_at
    assert probe is not None
    assert allow_request(HALF_OPEN, probe) == (HALF_OPEN, False)
    assert allow_request(HALF_OPEN, probe + ms(4_999)) == (HALF_OPEN, False)
    assert lease_live(HALF_OPEN, probe + ms(4_999)) is True
    assert lease_live(HALF_OPEN, probe + ms(5_000)) is False


def test_half_open_with_an_expired_lease_reopens_back_dated_to_the_lease_end() -> None:
    probe = HALF_OPEN.probe_started_at
    assert probe is not None
    lease_end = probe + ms(5_000)
    after, allowed = allow_request(HALF_OPEN, lease_end + ms(9_999))
    assert allowed is False
    assert after == HALF_OPEN.model_copy(
        update={"state": "open", "last_failure_at": lease_end, "probe_started_at": None}
    )
    # The cooldown now runs from the lease end: the re-armed breaker grants at lease_end + 10 s.
    reopened, allowed = allow_request(after, lease_end + ms(10_000))
    assert allowed is True
    assert reopened.probe_started_at == lease_end + ms(10_000)


def test_half_open_with_an_expired_lease_grants_a_new_probe_in_the_same_call() -> None:
    # Scenario 35, second half: the re-armed cooldown has already elapsed.
    probe = HALF_OPEN.probe_started_at
    assert probe is not None
    now = probe + ms(5_000) + ms(10_000)
    after, allowed = allow_request(HALF_OPEN, now)
    assert allowed is True
    assert after == HALF_OPEN.model_copy(
        update={"last_failure_at": probe + ms(5_000), "probe_started_at": now}
    )


def test_a_zero_probe_timeout_never_expires_the_lease() -> None:
    held = HALF_OPEN.model_copy(update={"probe_timeout_ms": 0})
    assert allow_request(held, T0 + timedelta(days=365)) == (held, False)
    assert lease_live(held, T0 + timedelta(days=365)) is True


def test_would_allow_request_agrees_with_allow_request_and_consumes_nothing() -> None:
    breakers = [
        state(),
        OPEN,
        HALF_OPEN,
        HALF_OPEN.model_copy(update={"probe_timeout_ms": 0}),
        state(state="open", last_failure_at=T0, recovery_ms=0, probe_timeout_ms=0),
    ]
    for breaker in breakers:
        for offset in (0, 1, 4_999, 5_000, 9_999, 10_000, 14_999, 15_000, 25_000, 10**9):
            now = T0 + ms(offset)
            expected = allow_request(breaker, now)[1]
            assert would_allow_request(breaker, now) is expected
            assert is_tool_available(breaker, now) is expected
            # Asking twice gives the same answer: the read did not take the probe.
            assert would_allow_request(breaker, now) is expected


# -- record_failure (§11.2 row 2) -------------------------------------------------------------


def test_failures_below_the_threshold_keep_the_breaker_closed() -> None:
    after = record_failure(record_failure(state(), T0, 1.0), T0 + ms(1), 2.0)
    assert after.state == "closed"
    assert after.consecutive_failures == 2
    assert after.last_failure_at == T0 + ms(1)
    assert allow_request(after, T0 + ms(2)) == (after, True)


def test_the_threshold_th_consecutive_failure_opens() -> None:
    breaker = state()
    for i in range(3):
        breaker = record_failure(breaker, T0 + ms(i), 1.0)
    assert breaker.state == "open"
    assert breaker.consecutive_failures == 3
    assert breaker.last_failure_at == T0 + ms(2)
    assert breaker.probe_started_at is None


def test_threshold_zero_never_trips_but_counts() -> None:
    breaker = initial_state(CircuitBreaker(failure_threshold=0, recovery_s=0))
    for i in range(50):
        breaker = record_failure(breaker, T0 + ms(i), 1.0)
        assert allow_request(breaker, T0 + ms(i))[1] is True
    assert breaker.state == "closed"
    assert (breaker.consecutive_failures, breaker.failures) == (50, 50)


def test_a_failed_probe_reopens() -> None:
    now = T0 + ms(12_000)
    after = record_failure(HALF_OPEN, now, 3.5)
    assert after == HALF_OPEN.model_copy(
        update={
            "state": "open",
            "consecutive_failures": 4,
            "last_failure_at": now,
            "probe_started_at": None,
            "failures": 1,
            "ewma_micros": 700_000,
            "last_duration_ms": 3.5,
        }
    )


def test_a_failure_while_open_restarts_the_cooldown() -> None:
    after = record_failure(OPEN, T0 + ms(8_000), 1.0)
    assert after.state == "open"
    assert after.consecutive_failures == 4
    assert after.last_failure_at == T0 + ms(8_000)
    assert allow_request(after, T0 + ms(10_000))[1] is False
    assert allow_request(after, T0 + ms(18_000))[1] is True


# -- record_success (§11.2 row 3) -------------------------------------------------------------


def test_a_success_resets_a_closed_breaker() -> None:
    after = record_success(state(consecutive_failures=2, last_failure_at=T0), T0 + ms(1), 4.0)
    assert after.state == "closed"
    assert after.consecutive_failures == 0
    assert after.last_failure_at == T0
    assert (after.successes, after.last_duration_ms) == (1, 4.0)


def test_a_successful_probe_closes() -> None:
    after = record_success(HALF_OPEN, T0 + ms(12_000), 2.0)
    assert after == HALF_OPEN.model_copy(
        update={
            "state": "closed",
            "consecutive_failures": 0,
            "probe_started_at": None,
            "successes": 1,
            "last_duration_ms": 2.0,
        }
    )


def test_open_ignores_a_success() -> None:
    # Scenario 35, first half: a stale success from before the trip.
    after = record_success(OPEN, T0 + ms(20_000), 1.0)
    assert after == OPEN.model_copy(update={"successes": 1, "last_duration_ms": 1.0})
    assert after.state == "open"
    assert after.health is Health.UNHEALTHY


def test_a_late_success_after_the_lease_expired_reopens_from_the_lease_end() -> None:
    probe = HALF_OPEN.probe_started_at
    assert probe is not None
    after = record_success(HALF_OPEN, probe + ms(5_000), 1.0)
    assert after == HALF_OPEN.model_copy(
        update={
            "state": "open",
            "last_failure_at": probe + ms(5_000),
            "probe_started_at": None,
            "successes": 1,
            "last_duration_ms": 1.0,
        }
    )


# -- acceptance scenarios 30-35, as direct calls ----------------------------------------------


def test_scenario_30_threshold_one_trips_after_one_failure() -> None:
    breaker = initial_state(CircuitBreaker(failure_threshold=1))
    breaker, allowed = allow_request(breaker, T0)
    assert allowed is True
    breaker = record_failure(breaker, T0 + ms(1), 1.0)
    breaker, allowed = allow_request(breaker, T0 + ms(2))
    assert allowed is False
    assert breaker.state == "open"


def test_scenario_31_a_poor_score_does_not_block() -> None:
    breaker = initial_state(CircuitBreaker(failure_threshold=5))
    scores = []
    for i, ok in enumerate([False, False, True, True]):
        breaker, allowed = allow_request(breaker, T0 + ms(i))
        assert allowed is True
        record = record_success if ok else record_failure
        breaker = record(breaker, T0 + ms(i), 1.0)
        scores.append((breaker.ewma_micros, breaker.health))
    assert scores == [
        (700_000, Health.UNHEALTHY),  # 0.3 * 0 + 0.7 * 0.7 = 0.49
        (490_000, Health.UNHEALTHY),  # 0.343
        (643_000, Health.DEGRADED),  # 0.3 / 3 + 0.7 * 0.643 = 0.5501
        (750_100, Health.DEGRADED),  # 0.15 + 0.52507 = 0.67507
    ]
    assert breaker.state == "closed"
    assert breaker.score == pytest.approx(0.3 * 0.5 + 0.7 * 0.7501)


def test_scenario_32_an_open_breaker_refuses_retries_for_the_whole_cooldown() -> None:
    breaker = record_failure(
        initial_state(CircuitBreaker(failure_threshold=1, recovery_s=60)), T0, 1
    )
    for offset in (0, 1, 100, 59_999):
        breaker, allowed = allow_request(breaker, T0 + ms(offset))
        assert allowed is False
    assert allow_request(breaker, T0 + ms(60_000))[1] is True


def test_scenario_33_retrips_on_a_failed_probe_then_closes_on_success() -> None:
    breaker = initial_state(CircuitBreaker(failure_threshold=1, recovery_s=0))
    states = []
    for i, ok in enumerate([False, False, True, True]):
        breaker, allowed = allow_request(breaker, T0 + ms(i))
        assert allowed is True
        breaker = (record_success if ok else record_failure)(breaker, T0 + ms(i), 1.0)
        states.append(breaker.state)
    assert states == ["open", "open", "closed", "closed"]
    assert (breaker.successes, breaker.failures, breaker.consecutive_failures) == (2, 2, 0)


def test_scenario_34_concurrent_calls_share_one_probe() -> None:
    breaker = record_failure(
        initial_state(CircuitBreaker(failure_threshold=1, recovery_s=0)), T0, 1
    )
    breaker, first = allow_request(breaker, T0)
    breaker, twin = allow_request(breaker, T0)
    assert (first, twin) == (True, False)
    assert breaker.state == "half_open"


def test_scenario_35_open_ignores_success_and_expired_leases_rearm_from_the_lease_end() -> None:
    config = CircuitBreaker(failure_threshold=1, recovery_s=1, probe_timeout_s=2)
    breaker = record_failure(initial_state(config), T0, 1.0)
    breaker = record_success(breaker, T0 + ms(500), 1.0)
    assert breaker.state == "open"
    assert allow_request(breaker, T0 + ms(999))[1] is False
    breaker, allowed = allow_request(breaker, T0 + ms(1_000))
    assert (breaker.state, allowed) == ("half_open", True)
    # The probe never reports. The lease ended at 3 s; the re-armed cooldown at 4 s.
    rearmed, allowed = allow_request(breaker, T0 + ms(3_500))
    assert (rearmed.state, rearmed.last_failure_at, allowed) == ("open", T0 + ms(3_000), False)
    regranted, allowed = allow_request(breaker, T0 + ms(4_000))
    assert allowed is True
    assert (regranted.state, regranted.last_failure_at) == ("half_open", T0 + ms(3_000))
    assert regranted.probe_started_at == T0 + ms(4_000)


# -- scores (§11.3) ---------------------------------------------------------------------------


def test_a_new_breaker_scores_one_and_is_healthy() -> None:
    breaker = state()
    assert (breaker.success_rate, breaker.ewma, breaker.score) == (1.0, 1.0, 1.0)
    assert breaker.health is Health.HEALTHY


def test_ewma_updates_in_fixed_point() -> None:
    breaker = state()
    seen = []
    for ok in [False, True, False, False, True]:
        breaker = (record_success if ok else record_failure)(breaker, T0, 1.0)
        seen.append(breaker.ewma_micros)
    assert seen == [700_000, 790_000, 553_000, 387_100, 570_970]
    assert breaker.success_rate == pytest.approx(0.4)
    assert breaker.score == pytest.approx(0.3 * 0.4 + 0.7 * 0.57097)


@pytest.mark.parametrize(
    ("successes", "failures", "ewma_micros", "health"),
    [
        (4, 1, 800_000, Health.HEALTHY),  # exactly 0.8
        (4, 1, 799_999, Health.DEGRADED),
        (1, 1, 500_000, Health.DEGRADED),  # exactly 0.5
        (1, 1, 499_999, Health.UNHEALTHY),
        (0, 0, 714_286, Health.HEALTHY),  # rate 1.0 before any outcome
        (0, 0, 714_285, Health.DEGRADED),
        (0, 10, 0, Health.UNHEALTHY),
    ],
)
def test_health_bands_are_exact_at_the_boundaries(
    successes: int, failures: int, ewma_micros: int, health: Health
) -> None:
    breaker = state(successes=successes, failures=failures, ewma_micros=ewma_micros)
    assert breaker.health is health


def test_an_open_breaker_is_always_unhealthy() -> None:
    assert OPEN.score == 1.0
    assert OPEN.health is Health.UNHEALTHY
    assert HALF_OPEN.health is Health.HEALTHY


# -- HealthStore on SQLite and PostgreSQL -----------------------------------------------------


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[AuditStore]:
    audit = AuditStore(db_url)
    yield audit
    await audit.close()


@pytest.fixture
def health(store: AuditStore) -> HealthStore:
    return HealthStore(store)


@pytest.fixture
def tool() -> str:
    # The PostgreSQL database is shared by the test session: one tool name per test.
    return f"tool-{uuid.uuid4().hex}"


async def test_breakers_are_created_lazily(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=2, recovery_s=1.5, probe_timeout_s=0)
    assert await health.snapshot(tool) is None
    assert await health.would_allow_request(tool, config) is True
    assert await health.is_tool_available(tool, config) is True
    assert await health.snapshot(tool) is None  # reads create nothing
    assert await health.allow_request(tool, config) is True
    assert await health.snapshot(tool) == initial_state(config)


async def test_record_creates_the_breaker_too(health: HealthStore, tool: str) -> None:
    before = datetime.now(UTC)
    await health.record(tool, is_error=True, duration_ms=12.5, config=CircuitBreaker())
    after = datetime.now(UTC)
    snap = await health.snapshot(tool)
    assert snap is not None
    assert snap.model_dump(exclude={"last_failure_at"}) == {
        "state": "closed",
        "consecutive_failures": 1,
        "probe_started_at": None,
        "failure_threshold": 3,
        "recovery_ms": 30_000,
        "probe_timeout_ms": 30_000,
        "successes": 0,
        "failures": 1,
        "ewma_micros": 700_000,
        "last_duration_ms": 12.5,
    }
    # The database server's clock, in UTC (the server runs on this machine).
    assert snap.last_failure_at is not None
    assert snap.last_failure_at.tzinfo is not None
    assert before - ms(1_000) <= snap.last_failure_at <= after + ms(1_000)


async def test_the_config_is_frozen_at_creation(health: HealthStore, tool: str) -> None:
    first = CircuitBreaker(failure_threshold=1, recovery_s=60)
    later = CircuitBreaker(failure_threshold=5, recovery_s=0)
    assert await health.allow_request(tool, first) is True
    await health.record(tool, is_error=True, duration_ms=1, config=later)
    assert await health.allow_request(tool, later) is False
    snap = await health.snapshot(tool)
    assert snap is not None
    assert (snap.state, snap.failure_threshold, snap.recovery_ms, snap.probe_timeout_ms) == (
        "open",
        1,
        60_000,
        60_000,
    )


async def test_threshold_trips_and_success_resets(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=2, recovery_s=60)
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    await health.record(tool, is_error=False, duration_ms=1, config=config)
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    assert await health.allow_request(tool, config) is True
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    assert await health.allow_request(tool, config) is False
    assert await health.would_allow_request(tool, config) is False
    # Scenario 35: a stale success does not close an Open breaker.
    await health.record(tool, is_error=False, duration_ms=1, config=config)
    snap = await health.snapshot(tool)
    assert snap is not None
    assert (snap.state, snap.consecutive_failures, snap.successes, snap.failures) == (
        "open",
        2,
        2,
        3,
    )


async def test_threshold_zero_never_trips(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=0, recovery_s=60)
    for _ in range(5):
        assert await health.allow_request(tool, config) is True
        await health.record(tool, is_error=True, duration_ms=1, config=config)
    snap = await health.snapshot(tool)
    assert snap is not None
    assert (snap.state, snap.consecutive_failures, snap.ewma_micros) == ("closed", 5, 168_070)


async def test_scenario_33_with_cooldown_zero(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=1, recovery_s=0)
    states = []
    for ok in [False, False, True, True]:
        assert await health.allow_request(tool, config) is True
        await health.record(tool, is_error=not ok, duration_ms=1, config=config)
        snap = await health.snapshot(tool)
        assert snap is not None
        states.append(snap.state)
    assert states == ["open", "open", "closed", "closed"]


async def test_reads_never_consume_the_probe(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=1, recovery_s=0)
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    for _ in range(3):
        assert await health.would_allow_request(tool, config) is True
    snap = await health.snapshot(tool)
    assert snap is not None
    assert snap.state == "open"
    assert await health.allow_request(tool, config) is True
    assert await health.would_allow_request(tool, config) is False
    assert await health.allow_request(tool, config) is False


async def test_cooldown_and_probe_lease_in_real_time(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=1, recovery_s=0.4, probe_timeout_s=0.4)
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    assert await health.allow_request(tool, config) is False
    await asyncio.sleep(0.45)
    assert await health.allow_request(tool, config) is True  # the probe
    probe = await health.snapshot(tool)
    assert probe is not None
    assert probe.state == "half_open"
    assert probe.probe_started_at is not None
    assert await health.allow_request(tool, config) is False  # lease live: single flight
    await asyncio.sleep(0.45)
    # The lease expired: Open again, cooldown re-armed from the lease end (not yet elapsed).
    assert await health.allow_request(tool, config) is False
    reopened = await health.snapshot(tool)
    assert reopened is not None
    assert (reopened.state, reopened.last_failure_at, reopened.probe_started_at) == (
        "open",
        probe.probe_started_at + ms(400),
        None,
    )
    await asyncio.sleep(0.4)
    assert await health.allow_request(tool, config) is True
    await health.record(tool, is_error=False, duration_ms=1, config=config)
    closed = await health.snapshot(tool)
    assert closed is not None
    assert (closed.state, closed.consecutive_failures, closed.probe_started_at) == (
        "closed",
        0,
        None,
    )


async def test_a_late_success_after_the_lease_reopens(health: HealthStore, tool: str) -> None:
    config = CircuitBreaker(failure_threshold=1, recovery_s=0, probe_timeout_s=0.2)
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    assert await health.allow_request(tool, config) is True
    probe = await health.snapshot(tool)
    assert probe is not None
    assert probe.probe_started_at is not None
    await asyncio.sleep(0.25)
    await health.record(tool, is_error=False, duration_ms=1, config=config)
    snap = await health.snapshot(tool)
    assert snap is not None
    assert (snap.state, snap.last_failure_at, snap.successes) == (
        "open",
        probe.probe_started_at + ms(200),
        1,
    )


async def test_exactly_one_probe_across_workers(
    db_url: str, health: HealthStore, tool: str
) -> None:
    config = CircuitBreaker(failure_threshold=1, recovery_s=0)
    await health.record(tool, is_error=True, duration_ms=1, config=config)
    workers = [AuditStore(db_url) for _ in range(20)]
    try:
        granted = await asyncio.gather(
            *(HealthStore(worker).allow_request(tool, config) for worker in workers)
        )
    finally:
        for worker in workers:
            await worker.close()
    assert granted.count(True) == 1
    assert granted.count(False) == 19
    snap = await health.snapshot(tool)
    assert snap is not None
    assert snap.state == "half_open"


async def test_concurrent_outcomes_are_never_lost(
    db_url: str, health: HealthStore, tool: str
) -> None:
    # 20 workers touch a tool nobody has seen: one creates it, none loses its update.
    config = CircuitBreaker(failure_threshold=100)
    workers = [AuditStore(db_url) for _ in range(20)]
    try:
        await asyncio.gather(
            *(
                HealthStore(worker).record(tool, is_error=i % 2 == 0, duration_ms=i, config=config)
                for i, worker in enumerate(workers)
            )
        )
    finally:
        for worker in workers:
            await worker.close()
    snap = await health.snapshot(tool)
    assert snap is not None
    assert (snap.state, snap.successes, snap.failures, snap.failure_threshold) == (
        "closed",
        10,
        10,
        100,
    )
