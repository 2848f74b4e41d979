"""Idempotency (guardrails spec §5): keys, policies, the in-memory and SQL stores, resolution.

The SQL tests run on SQLite and on PostgreSQL (``db_url``). The PostgreSQL database is shared
by the test session, so every test uses fresh keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.clock import T0, FakeClock
from tooltrail.core.text import canonical_json
from tooltrail.db.idempotency import SqlIdempotencyStore
from tooltrail.db.orm import IdempotencyRecordRow
from tooltrail.db.store import AuditStore
from tooltrail.errors import ToolDefinitionError, TooltrailError
from tooltrail.tools.idempotency import (
    Acquired,
    Busy,
    CachedToolError,
    Claim,
    Completed,
    Idempotency,
    IdempotencyKeyError,
    IdempotencyStore,
    IdempotencyStoreUnavailable,
    InMemoryIdempotencyStore,
    StoredOutcome,
    busy_text,
    canonical_snapshot_text,
    derive_key,
    resolve_idempotency,
    run_idempotent,
)


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    a: int
    b: str = "x"
    tags: list[str] = []


class Title(BaseModel):
    model_config = ConfigDict(frozen=True)

    title: str


class Point(BaseModel):
    x: int
    y: int


def sha(text_: str) -> str:
    return hashlib.sha256(text_.encode("utf-8")).hexdigest()


def new_key() -> str:
    return sha(uuid.uuid4().hex)


HASH = Idempotency()


# -- key derivation --------------------------------------------------------------------------


def test_key_is_the_sha256_of_the_canonical_material() -> None:
    key = derive_key("t", Args(a=1), policy=HASH, principal_id="p1")
    expected = sha('["tooltrail-idem/1","t","p1","{\\"a\\":1,\\"b\\":\\"x\\",\\"tags\\":[]}"]')
    assert key == expected
    assert len(key) == 64


def test_key_keeps_non_ascii_text_and_ignores_field_order() -> None:
    key = derive_key("t", Args(b="é", a=2), policy=HASH, principal_id=None)
    assert key == sha('["tooltrail-idem/1","t",null,"{\\"a\\":2,\\"b\\":\\"é\\",\\"tags\\":[]}"]')
    assert key == derive_key(
        "t", Args.model_validate({"b": "é", "a": "2"}), policy=HASH, principal_id=None
    )


def test_key_depends_on_tool_name_arguments_and_principal() -> None:
    base = derive_key("t", Args(a=1), policy=HASH, principal_id="p1")
    assert derive_key("u", Args(a=1), policy=HASH, principal_id="p1") != base
    assert derive_key("t", Args(a=2), policy=HASH, principal_id="p1") != base
    assert derive_key("t", Args(a=1), policy=HASH, principal_id="p2") != base
    assert derive_key("t", Args(a=1, b="x"), policy=HASH, principal_id="p1") == base


def test_global_scope_ignores_the_principal() -> None:
    glob = Idempotency(scope="global")
    keys = {derive_key("t", Args(a=1), policy=glob, principal_id=p) for p in ("p1", "p2", None)}
    assert keys == {
        sha('["tooltrail-idem/1","t",null,"{\\"a\\":1,\\"b\\":\\"x\\",\\"tags\\":[]}"]')
    }
    assert keys != {derive_key("t", Args(a=1), policy=HASH, principal_id="p1")}


def test_key_accepts_a_snapshot_and_uses_its_frozen_bytes() -> None:
    model = Args(a=1, tags=["q"])
    same = SimpleNamespace(model=model, canonical=canonical_snapshot_text(model).encode())
    assert derive_key("t", same, policy=HASH, principal_id="p1") == derive_key(
        "t", model, policy=HASH, principal_id="p1"
    )
    # The snapshot's bytes, computed once when the arguments were frozen, are the material
    # (spec §4.3): the model is not serialised a second time.
    other = SimpleNamespace(model=model, canonical=b'{"a":2}')
    assert (
        derive_key("t", other, policy=HASH, principal_id="p1")
        == hashlib.sha256(
            canonical_json(["tooltrail-idem/1", "t", "p1", '{"a":2}']).encode()
        ).hexdigest()
    )
    with pytest.raises(TypeError, match="pydantic model or a snapshot"):
        derive_key("t", {"a": 1}, policy=HASH, principal_id="p1")


def test_explicit_key_uses_the_key_function_result_as_material() -> None:
    policy = Idempotency(strategy="explicit", key=lambda m: m.title.strip().lower())  # type: ignore[attr-defined]
    k1 = derive_key("t", Title(title="Bug"), policy=policy, principal_id="p1")
    k2 = derive_key("t", Title(title=" bug "), policy=policy, principal_id="p1")
    assert k1 == k2 == sha('["tooltrail-idem/1","t","p1","bug"]')


def test_explicit_key_function_cannot_alter_the_snapshot() -> None:
    def mutate(model: BaseModel) -> str:
        model.tags.append("evil")  # type: ignore[attr-defined]
        return "k"

    model = Args(a=1, tags=["a"])
    derive_key("t", model, policy=Idempotency(strategy="explicit", key=mutate), principal_id=None)
    assert model.tags == ["a"]


@pytest.mark.parametrize(
    ("key_fn", "message"),
    [
        (lambda m: "", "must return a non-empty str, got ''"),
        (lambda m: 42, "must return a non-empty str, got 42"),
        (lambda m: None, "must return a non-empty str, got None"),
    ],
)
def test_explicit_key_must_be_a_non_empty_string(key_fn: Any, message: str) -> None:
    policy = Idempotency(strategy="explicit", key=key_fn)
    with pytest.raises(IdempotencyKeyError, match=message) as info:
        derive_key("t", Title(title="x"), policy=policy, principal_id="p1")
    assert isinstance(info.value, TooltrailError)
    assert "'t'" in str(info.value)


def test_explicit_key_function_that_raises_is_wrapped() -> None:
    boom = RuntimeError("no title")

    def fail(model: BaseModel) -> str:
        raise boom

    with pytest.raises(IdempotencyKeyError, match="raised RuntimeError: no title") as info:
        derive_key(
            "t",
            Title(title="x"),
            policy=Idempotency(strategy="explicit", key=fail),
            principal_id=None,
        )
    assert info.value.__cause__ is boom


def test_strategy_none_has_no_key() -> None:
    with pytest.raises(ValueError, match="strategy 'none'"):
        derive_key("t", Args(a=1), policy=Idempotency(strategy="none"), principal_id=None)


# -- policies --------------------------------------------------------------------------------


def test_policy_defaults_match_the_spec() -> None:
    policy = Idempotency()
    assert (
        policy.strategy,
        policy.key,
        policy.ttl_seconds,
        policy.cache_failures,
        policy.scope,
        policy.lease_seconds,
        policy.wait_timeout_seconds,
    ) == ("hash_input", None, 3600, False, "principal", 60.0, 90.0)
    with pytest.raises(AttributeError):
        policy.ttl_seconds = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (Idempotency(strategy="explicit"), "strategy 'explicit' needs a key function"),
        (Idempotency(key=lambda m: "k"), "a key function needs strategy='explicit'"),
        (Idempotency(strategy="none", key=lambda m: "k"), "needs strategy='explicit', not 'none'"),
        (Idempotency(ttl_seconds=0), "ttl_seconds must be > 0, got 0"),
        (Idempotency(ttl_seconds=-5), "ttl_seconds must be > 0, got -5"),
        (
            Idempotency(lease_seconds=60, wait_timeout_seconds=59.9),
            r"wait_timeout_seconds \(59.9\) must be >= lease_seconds \(60\)",
        ),
        (Idempotency(lease_seconds=0, wait_timeout_seconds=1), "lease_seconds must be > 0"),
        (Idempotency(strategy="random"), "unknown strategy 'random'"),  # type: ignore[arg-type]
        (Idempotency(scope="tenant"), "unknown scope 'tenant'"),  # type: ignore[arg-type]
    ],
)
def test_invalid_policies_fail_registration(policy: Idempotency, message: str) -> None:
    with pytest.raises(ToolDefinitionError, match=message) as info:
        policy.validate_for("my_tool")
    assert str(info.value).startswith("idempotency policy of tool 'my_tool': ")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "policy",
    [
        Idempotency(),
        Idempotency(strategy="explicit", key=lambda m: "k"),
        Idempotency(strategy="none"),
        Idempotency(ttl_seconds=1, lease_seconds=0.3, wait_timeout_seconds=0.3),
    ],
)
def test_valid_policies_pass(policy: Idempotency) -> None:
    policy.validate_for("t")


def test_resolve_idempotency() -> None:
    assert resolve_idempotency(True) == Idempotency()
    assert resolve_idempotency(False) is None
    assert resolve_idempotency(None) is None
    assert resolve_idempotency(Idempotency(strategy="none")) is None
    custom = Idempotency(ttl_seconds=5, scope="global")
    assert resolve_idempotency(custom) is custom
    with pytest.raises(ToolDefinitionError, match="got 'yes'"):
        resolve_idempotency("yes")  # type: ignore[arg-type]


# -- the in-memory store ---------------------------------------------------------------------


async def test_memory_store_claim_complete_get() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    out = StoredOutcome(ok=True, value=Point(x=1, y=2), source_call_id="c1")
    assert out.value == {"x": 1, "y": 2}
    assert await store.claim("k", tool_name="t", owner="c1#1", lease_seconds=60) == Acquired()
    assert await store.claim("k", tool_name="t", owner="c2#1", lease_seconds=60) == Busy(
        T0 + timedelta(seconds=60)
    )
    assert await store.get("k") is None
    assert await store.complete("k", owner="c2#1", outcome=out, ttl_seconds=10) is False
    assert await store.complete("k", owner="c1#1", outcome=out, ttl_seconds=10) is True
    assert await store.complete("k", owner="c1#1", outcome=out, ttl_seconds=10) is False
    assert await store.get("k") == out
    assert await store.claim("k", tool_name="t", owner="c3#1", lease_seconds=60) == Completed(out)
    clock.advance(9.999)
    assert await store.get("k") == out
    clock.advance(0.001)
    assert await store.get("k") is None
    assert await store.claim("k", tool_name="t", owner="c3#1", lease_seconds=60) == Acquired()
    record = await store.record("k")
    assert record is not None
    assert (record.state, record.owner, record.outcome) == ("pending", "c3#1", None)


async def test_memory_store_lease_takeover_and_owner_checks() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    assert await store.claim("k", tool_name="t", owner="dead#1", lease_seconds=60) == Acquired()
    clock.advance(60)
    # Not yet: the lease lapses strictly after its end.
    assert isinstance(await store.claim("k", tool_name="t", owner="c2#1", lease_seconds=60), Busy)
    assert await store.renew("k", owner="c2#1", lease_seconds=60) is False
    clock.advance(0.001)
    assert await store.claim("k", tool_name="t", owner="c2#1", lease_seconds=60) == Acquired()
    assert await store.renew("k", owner="dead#1", lease_seconds=60) is False
    await store.release("k", owner="dead#1")
    record = await store.record("k")
    assert record is not None and record.owner == "c2#1"
    assert await store.renew("k", owner="c2#1", lease_seconds=30) is True
    record = await store.record("k")
    assert record is not None and record.lease_expires_at == clock.now + timedelta(seconds=30)
    await store.release("k", owner="c2#1")
    assert await store.record("k") is None


async def test_memory_store_put_replaces_and_is_honoured() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    await store.claim("k", tool_name="t", owner="c1#1", lease_seconds=60)
    cached = StoredOutcome(ok=True, value="CACHED", source_call_id="c0")
    await store.put("k", cached, ttl_seconds=60)
    assert await store.claim("k", tool_name="t", owner="c9#1", lease_seconds=60) == Completed(
        cached
    )
    # The replaced claim can no longer complete.
    assert await store.complete("k", owner="c1#1", outcome=cached, ttl_seconds=60) is False
    assert await store.purge_expired() == 0
    clock.advance(60)
    assert await store.purge_expired() == 1
    assert await store.record("k") is None


async def test_memory_store_accepts_a_float_clock() -> None:
    now = [1_700_000_000.0]
    store = InMemoryIdempotencyStore(clock=lambda: now[0])
    await store.put("k", StoredOutcome(ok=True, value=1), ttl_seconds=5)
    assert await store.get("k") is not None
    now[0] += 5
    assert await store.get("k") is None


# -- resolution with the in-memory store -----------------------------------------------------


class Runs:
    def __init__(self) -> None:
        self.count = 0

    def body(self, value: Any = "done", *, delay: float = 0.0) -> Callable[[], Any]:
        async def run() -> Any:
            self.count += 1
            if delay:
                await asyncio.sleep(delay)
            return value

        return run

    def failing(self, exc: BaseException) -> Callable[[], Any]:
        async def run() -> Any:
            self.count += 1
            raise exc

        return run


async def run(
    store: Any,
    runs_body: Callable[[], Any],
    *,
    call_id: str = "c1",
    key: str = "k",
    policy: Idempotency = HASH,
    **kw: Any,
) -> Any:
    return await run_idempotent(
        store,
        key=key,
        policy=policy,
        tool_name="t",
        call_id=call_id,
        attempt=1,
        body=runs_body,
        **kw,
    )


async def test_success_is_cached_and_served_as_a_hit() -> None:
    store = InMemoryIdempotencyStore(clock=FakeClock())
    runs = Runs()
    first = await run(store, runs.body(Point(x=1, y=2)), call_id="c1")
    assert (first.status, first.value, first.source_call_id, first.lease_lost) == (
        "ok",
        {"x": 1, "y": 2},
        "c1",
        False,
    )
    second = await run(store, runs.body("other"), call_id="c2")
    assert (second.status, second.value, second.source_call_id, second.key) == (
        "cache_hit",
        {"x": 1, "y": 2},
        "c1",
        "k",
    )
    assert runs.count == 1
    assert first.is_error is False and second.text is None


async def test_failure_is_released_and_the_same_exception_propagates() -> None:
    store = InMemoryIdempotencyStore(clock=FakeClock())
    runs = Runs()
    exc = ValueError("boom")
    with pytest.raises(ValueError, match="boom") as info:
        await run(store, runs.failing(exc))
    assert info.value is exc
    assert await store.record("k") is None
    result = await run(store, runs.body("ok"), call_id="c2")
    assert (result.status, result.value, runs.count) == ("ok", "ok", 2)


async def test_cached_failure_raises_cached_tool_error() -> None:
    store = InMemoryIdempotencyStore(clock=FakeClock())
    runs = Runs()
    policy = Idempotency(cache_failures=True)
    exc = ValueError("boom")
    with pytest.raises(ValueError, match="boom") as info:
        await run(store, runs.failing(exc), policy=policy, call_id="c1")
    assert info.value is exc
    with pytest.raises(CachedToolError) as cached:
        await run(store, runs.body(), policy=policy, call_id="c2")
    err = cached.value
    assert (err.error_type, err.message, err.source_call_id) == ("ValueError", "boom", "c1")
    assert str(err) == "ValueError: boom"
    assert runs.count == 1


async def test_cancellation_releases_the_claim() -> None:
    store = InMemoryIdempotencyStore()
    started = asyncio.Event()

    async def body() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(run(store, body))
    await started.wait()
    assert (await store.record("k")) is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.record("k") is None


async def test_busy_polls_with_backoff_and_gives_up_with_the_exact_text() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    await store.claim("k", tool_name="t", owner="other#1", lease_seconds=3600)
    sleeps: list[float] = []
    beats: list[int] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)

    runs = Runs()
    policy = Idempotency(lease_seconds=1, wait_timeout_seconds=10)
    result = await run(
        store, runs.body(), policy=policy, sleep=fake_sleep, heartbeat=lambda: beats.append(1)
    )
    assert result.status == "idempotency_busy"
    assert result.is_error is True
    assert result.text == (
        "idempotency busy: tool 't' is already running with the same arguments; gave up after 10s"
    )
    assert sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 0.9])
    assert len(beats) == len(sleeps)
    assert runs.count == 0
    assert busy_text("t", 0.5).endswith("gave up after 0.5s")


async def test_waiter_gets_the_outcome_when_the_owner_completes() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    await store.claim("k", tool_name="t", owner="c1#1", lease_seconds=60)
    polls = 0

    async def fake_sleep(seconds: float) -> None:
        nonlocal polls
        polls += 1
        if polls == 3:
            done = StoredOutcome(ok=True, value=7, source_call_id="c1")
            await store.complete("k", owner="c1#1", outcome=done, ttl_seconds=60)

    runs = Runs()
    result = await run(store, runs.body(), call_id="c2", sleep=fake_sleep)
    assert (result.status, result.value, result.source_call_id, polls) == ("cache_hit", 7, "c1", 3)
    assert runs.count == 0


async def test_waiter_takes_over_a_dead_owner() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    await store.claim("k", tool_name="t", owner="dead#1", lease_seconds=60)
    clock.advance(61)
    runs = Runs()
    result = await run(store, runs.body("fresh"), call_id="c2")
    assert (result.status, result.value, runs.count) == ("ok", "fresh", 1)
    record = await store.record("k")
    assert record is not None
    assert (record.owner, record.state, record.source_call_id) == ("c2#1", "succeeded", "c2")


async def test_lost_lease_still_returns_the_result_uncached() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    hooks: list[tuple[Any, Any, bool]] = []

    async def body() -> str:
        clock.advance(61)
        assert await store.claim("k", tool_name="t", owner="thief#1", lease_seconds=60) == (
            Acquired()
        )
        return "mine"

    async def hook(session: Any, outcome: StoredOutcome, completed: bool) -> None:
        hooks.append((session, outcome.value, completed))

    result = await run(store, body, on_complete=hook)
    assert (result.status, result.value, result.lease_lost) == ("ok", "mine", True)
    assert hooks == [(None, "mine", False)]
    record = await store.record("k")
    assert record is not None and (record.owner, record.state) == ("thief#1", "pending")


class FlakyStore(InMemoryIdempotencyStore):
    def __init__(self, complete_failures: int = 0, claim_fails: bool = False) -> None:
        super().__init__(clock=FakeClock())
        self.complete_failures = complete_failures
        self.claim_fails = claim_fails
        self.complete_calls = 0

    async def claim(self, key: str, **kw: Any) -> Claim:
        if self.claim_fails:
            raise IdempotencyStoreUnavailable("down")
        return await super().claim(key, **kw)

    async def complete(self, key: str, **kw: Any) -> bool:
        self.complete_calls += 1
        if self.complete_calls <= self.complete_failures:
            raise IdempotencyStoreUnavailable("down")
        return await super().complete(key, **kw)


async def test_unavailable_store_fails_closed() -> None:
    runs = Runs()
    with pytest.raises(IdempotencyStoreUnavailable):
        await run(FlakyStore(claim_fails=True), runs.body())
    assert runs.count == 0


async def test_complete_is_retried_with_backoff_while_the_claim_is_ours() -> None:
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    store = FlakyStore(complete_failures=2)
    result = await run(store, Runs().body("v"), sleep=fake_sleep)
    assert (result.status, result.lease_lost, store.complete_calls) == ("ok", False, 3)
    assert sleeps == [0.1, 0.2]
    assert await store.get("k") == StoredOutcome(ok=True, value="v", source_call_id="c1")

    # Past the spec's three tries it keeps going (a short outage must not cost a second run
    # of the body), backing off to 2 s, until about 30 s have passed.
    sleeps.clear()
    store = FlakyStore(complete_failures=5)
    result = await run(store, Runs().body("v"), sleep=fake_sleep)
    assert (result.status, store.complete_calls) == ("ok", 6)
    assert sleeps == [0.1, 0.2, 0.4, 0.8, 1.6]

    sleeps.clear()
    store = FlakyStore(complete_failures=10_000)
    with pytest.raises(IdempotencyStoreUnavailable):
        await run(store, Runs().body("v"), sleep=fake_sleep)
    assert max(sleeps) == 2.0 and 28.0 <= sum(sleeps) <= 30.0
    assert store.complete_calls == len(sleeps) + 1


async def test_complete_inside_an_activity_keeps_trying_until_it_lands() -> None:
    # With a heartbeat (inside an activity), giving up would fail the activity and make
    # Temporal run the body again: the owner keeps trying (a 2-minute outage here).
    sleeps: list[float] = []
    beats: list[int] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    store = FlakyStore(complete_failures=70)
    body = Runs().body("v")
    result = await run(store, body, sleep=fake_sleep, heartbeat=lambda: beats.append(1))
    assert (result.status, result.lease_lost, store.complete_calls) == ("ok", False, 71)
    assert sum(sleeps) > 120.0
    assert len(beats) >= 70
    assert await store.get("k") == StoredOutcome(ok=True, value="v", source_call_id="c1")


async def test_both_stores_implement_the_protocol(tmp_path: Path) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'unused.db'}")
    try:
        # Checked by mypy: both satisfy the spec's contract structurally.
        stores: list[IdempotencyStore] = [InMemoryIdempotencyStore(), SqlIdempotencyStore(audit)]
        assert len(stores) == 2
    finally:
        await audit.close()


# -- the SQL store (SQLite and PostgreSQL) ---------------------------------------------------


@pytest.fixture
async def audit(db_url: str) -> AsyncIterator[AuditStore]:
    store = AuditStore(db_url)
    yield store
    await store.close()


@pytest.fixture
def sql(audit: AuditStore) -> SqlIdempotencyStore:
    return SqlIdempotencyStore(audit)


async def test_sql_claim_complete_get(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    before = datetime.now(UTC)
    assert (
        await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=60, scope_principal="p1")
        == Acquired()
    )
    busy = await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60)
    assert isinstance(busy, Busy) and busy.lease_expires_at is not None
    assert busy.lease_expires_at.tzinfo is not None
    # The database's clock, which runs on this machine: within a second of ours.
    lease_left = (busy.lease_expires_at - before).total_seconds()
    assert 59 < lease_left < 65
    assert await sql.get(key) is None

    out = StoredOutcome(ok=True, value={"n": [1, "é"]}, source_call_id="c1")
    assert await sql.complete(key, owner="c2#1", outcome=out, ttl_seconds=3600) is False
    assert await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=3600) is True
    assert await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=3600) is False
    assert await sql.get(key) == out
    assert await sql.claim(key, tool_name="t", owner="c3#1", lease_seconds=60) == Completed(out)

    record = await sql.record(key)
    assert record is not None
    assert (record.tool_name, record.scope_principal, record.state, record.owner) == (
        "t",
        "p1",
        "succeeded",
        "c1#1",
    )
    assert (record.source_call_id, record.outcome, record.lease_expires_at) == ("c1", out, None)
    assert record.completed_at is not None and record.expires_at is not None
    assert record.expires_at - record.completed_at == timedelta(seconds=3600)


async def test_sql_failure_outcome_round_trips(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=60)
    out = StoredOutcome(ok=False, error_type="ValueError", message="boom", source_call_id="c1")
    assert await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=60) is True
    assert await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60) == Completed(out)
    record = await sql.record(key)
    assert record is not None and record.state == "failed"


async def test_sql_ttl_expiry(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=60)
    out = StoredOutcome(ok=True, value=1, source_call_id="c1")
    assert await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=1) is True
    assert await sql.get(key) == out
    await asyncio.sleep(1.1)
    assert await sql.get(key) is None
    assert await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60) == Acquired()
    record = await sql.record(key)
    assert record is not None
    assert (record.state, record.owner, record.outcome, record.source_call_id) == (
        "pending",
        "c2#1",
        None,
        None,
    )
    assert record.expires_at is None and record.completed_at is None


async def test_sql_lease_expiry_takeover_and_owner_checks(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    assert await sql.claim(key, tool_name="t", owner="dead#1", lease_seconds=0.2) == Acquired()
    assert isinstance(await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60), Busy)
    await asyncio.sleep(0.3)
    assert await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60) == Acquired()
    out = StoredOutcome(ok=True, value="late", source_call_id="dead")
    assert await sql.renew(key, owner="dead#1", lease_seconds=60) is False
    assert await sql.complete(key, owner="dead#1", outcome=out, ttl_seconds=60) is False
    await sql.release(key, owner="dead#1")
    record = await sql.record(key)
    assert record is not None and (record.owner, record.state) == ("c2#1", "pending")

    assert record.lease_expires_at is not None
    await asyncio.sleep(0.05)
    assert await sql.renew(key, owner="c2#1", lease_seconds=120) is True
    renewed = await sql.record(key)
    assert renewed is not None and renewed.lease_expires_at is not None
    assert 60 < (renewed.lease_expires_at - record.lease_expires_at).total_seconds() < 65

    await sql.release(key, owner="c2#1")
    assert await sql.record(key) is None
    assert await sql.renew(key, owner="c2#1", lease_seconds=60) is False


async def test_sql_completed_rows_are_not_released_or_renewed(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=60)
    out = StoredOutcome(ok=True, value=1, source_call_id="c1")
    await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=60)
    await sql.release(key, owner="c1#1")
    assert await sql.renew(key, owner="c1#1", lease_seconds=60) is False
    assert await sql.get(key) == out


async def test_sql_put_is_honoured(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=60)
    cached = StoredOutcome(ok=True, value="CACHED", source_call_id="c0")
    await sql.put(key, cached, ttl_seconds=60)
    runs = Runs()
    hit = await run(sql, runs.body("fresh"), key=key, call_id="c9")
    assert (hit.status, hit.value, hit.source_call_id, runs.count) == (
        "cache_hit",
        "CACHED",
        "c0",
        0,
    )
    record = await sql.record(key)
    assert record is not None and record.tool_name == "t"  # an empty tool_name keeps the old

    failed_key = new_key()
    failure = StoredOutcome(ok=False, error_type="KeyError", message="'x'", source_call_id="c0")
    await sql.put(failed_key, failure, ttl_seconds=60, tool_name="t")
    with pytest.raises(CachedToolError) as info:
        await run(sql, runs.body(), key=failed_key)
    assert (info.value.error_type, info.value.message, runs.count) == ("KeyError", "'x'", 0)


async def test_sql_purge_deletes_only_expired_outcomes(sql: SqlIdempotencyStore) -> None:
    expired, live, pending = new_key(), new_key(), new_key()
    await sql.put(expired, StoredOutcome(ok=True, value=1), ttl_seconds=1, tool_name="t")
    await sql.put(live, StoredOutcome(ok=True, value=2), ttl_seconds=60, tool_name="t")
    await sql.claim(pending, tool_name="t", owner="c#1", lease_seconds=0.1)
    await asyncio.sleep(1.1)
    assert await sql.purge_expired() >= 1
    assert await sql.record(expired) is None
    assert await sql.record(live) is not None
    assert await sql.record(pending) is not None


async def test_sql_complete_hook_shares_the_transaction(
    sql: SqlIdempotencyStore, audit: AuditStore
) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=60)
    out = StoredOutcome(ok=True, value=1, source_call_id="c1")
    seen: list[tuple[str, bool]] = []

    async def failing_hook(session: AsyncSession | None, completed: bool) -> None:
        assert session is not None
        state = await session.scalar(
            select(IdempotencyRecordRow.state).where(IdempotencyRecordRow.key == key)
        )
        seen.append((str(state), completed))
        raise RuntimeError("audit insert failed")

    with pytest.raises(RuntimeError, match="audit insert failed"):
        await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=60, also=failing_hook)
    assert seen == [("succeeded", True)]
    # Rolled back with the hook: still pending, still c1's.
    record = await sql.record(key)
    assert record is not None and (record.state, record.owner) == ("pending", "c1#1")

    async def ok_hook(session: AsyncSession | None, completed: bool) -> None:
        assert session is not None
        seen.append(("ok", completed))

    assert await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=60, also=ok_hook)
    assert await sql.complete(key, owner="c1#1", outcome=out, ttl_seconds=60, also=ok_hook) is (
        False
    )
    assert seen[1:] == [("ok", True), ("ok", False)]


async def test_sql_run_idempotent_retries_the_completing_transaction(
    sql: SqlIdempotencyStore,
) -> None:
    key = new_key()
    calls: list[bool] = []

    async def hook(session: AsyncSession | None, outcome: StoredOutcome, completed: bool) -> None:
        assert session is not None and outcome.value == "v"
        calls.append(completed)
        if len(calls) < 3:
            raise IdempotencyStoreUnavailable("audit write failed")

    async def no_sleep(seconds: float) -> None:
        pass

    result = await run(sql, Runs().body("v"), key=key, on_complete=hook, sleep=no_sleep)
    # The first two transactions rolled back, so the third still found the claim pending.
    assert (result.status, result.lease_lost, calls) == ("ok", False, [True, True, True])
    assert await sql.get(key) == StoredOutcome(ok=True, value="v", source_call_id="c1")


async def test_sql_concurrent_calls_run_the_body_once(db_url: str) -> None:
    key = new_key()
    stores = [AuditStore(db_url) for _ in range(10)]
    runs = Runs()
    policy = Idempotency(lease_seconds=5, wait_timeout_seconds=30)
    try:
        results = await asyncio.gather(
            *(
                run(
                    SqlIdempotencyStore(s),
                    runs.body({"answer": 42}, delay=0.3),
                    key=key,
                    call_id=f"c{i}",
                    policy=policy,
                )
                for i, s in enumerate(stores)
            )
        )
    finally:
        for s in stores:
            await s.close()
    assert runs.count == 1
    statuses = sorted(r.status for r in results)
    assert statuses == ["cache_hit"] * 9 + ["ok"]
    (winner,) = [r for r in results if r.status == "ok"]
    assert all(r.value == {"answer": 42} for r in results)
    assert {r.source_call_id for r in results} == {winner.source_call_id}


@pytest.mark.parametrize("cache_failures", [False, True])
async def test_sql_cache_failures(sql: SqlIdempotencyStore, cache_failures: bool) -> None:
    key = new_key()
    policy = Idempotency(cache_failures=cache_failures)
    runs = Runs()
    exc = ValueError("boom")
    with pytest.raises(ValueError, match="boom") as info:
        await run(sql, runs.failing(exc), key=key, policy=policy)
    assert info.value is exc
    if cache_failures:
        with pytest.raises(CachedToolError) as cached:
            await run(sql, runs.body("v"), key=key, policy=policy, call_id="c2")
        assert (cached.value.error_type, cached.value.message) == ("ValueError", "boom")
        assert cached.value.source_call_id == "c1"
        assert runs.count == 1
    else:
        assert await sql.record(key) is None
        result = await run(sql, runs.body("v"), key=key, policy=policy, call_id="c2")
        assert (result.status, result.value, runs.count) == ("ok", "v", 2)


async def test_sql_wait_timeout_gives_up_with_the_exact_text(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="other#1", lease_seconds=30)
    runs = Runs()
    beats: list[int] = []
    started = time.monotonic()
    result = await run(
        sql,
        runs.body(),
        key=key,
        policy=Idempotency(lease_seconds=0.3, wait_timeout_seconds=0.5),
        heartbeat=lambda: beats.append(1),
    )
    elapsed = time.monotonic() - started
    assert result.status == "idempotency_busy"
    assert result.text == (
        "idempotency busy: tool 't' is already running with the same arguments; gave up after 0.5s"
    )
    assert (result.value, result.source_call_id, runs.count) == (None, None, 0)
    assert 0.5 <= elapsed < 3
    assert len(beats) >= 3
    record = await sql.record(key)
    assert record is not None and record.owner == "other#1"


async def test_sql_waiter_takes_over_a_dead_owner(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    await sql.claim(key, tool_name="t", owner="dead#1", lease_seconds=0.3)
    runs = Runs()
    policy = Idempotency(lease_seconds=0.3, wait_timeout_seconds=3)
    result = await run(sql, runs.body("fresh"), key=key, call_id="c2", policy=policy)
    assert (result.status, result.value, runs.count) == ("ok", "fresh", 1)
    record = await sql.record(key)
    assert record is not None and (record.owner, record.state) == ("c2#1", "succeeded")


async def test_sql_live_owner_renews_its_lease(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    runs = Runs()
    beats: list[int] = []
    # The body outlives its lease three times over; only renewals keep the waiter out.
    policy = Idempotency(lease_seconds=0.6, wait_timeout_seconds=5)
    owner = asyncio.create_task(
        run(
            sql,
            runs.body("slow", delay=1.8),
            key=key,
            policy=policy,
            heartbeat=lambda: beats.append(1),
        )
    )
    await asyncio.sleep(0.1)
    waiter = await run(sql, runs.body("second"), key=key, call_id="c2", policy=policy)
    first = await owner
    assert (first.status, first.lease_lost) == ("ok", False)
    assert (waiter.status, waiter.value, waiter.source_call_id) == ("cache_hit", "slow", "c1")
    assert runs.count == 1
    assert len(beats) >= 3  # every 0.2 s for 1.8 s: about nine


async def test_sql_cancellation_releases_the_claim(sql: SqlIdempotencyStore) -> None:
    key = new_key()
    started = asyncio.Event()

    async def body() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(run(sql, body, key=key))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await sql.record(key) is None


async def test_sql_store_unavailable(tmp_path: Path) -> None:
    # An unmigrated database (no table) and an unreachable server: both fail closed.
    for url in (f"sqlite:///{tmp_path / 'empty.db'}", "postgresql://postgres@127.0.0.1:9/none"):
        audit = AuditStore(url)
        try:
            store = SqlIdempotencyStore(audit)
            runs = Runs()
            with pytest.raises(IdempotencyStoreUnavailable, match=r"unavailable \(claim\)"):
                await run(store, runs.body(), key=new_key())
            assert runs.count == 0
            with pytest.raises(IdempotencyStoreUnavailable):
                await store.get(new_key())
        finally:
            await audit.close()


async def test_sql_times_come_from_the_database_clock(sql: SqlIdempotencyStore) -> None:
    # A lease written now by the database lapses by the database's clock: move the row's
    # lease to "one second ago" in SQL, and a takeover follows without any wait.
    key = new_key()
    await sql.claim(key, tool_name="t", owner="c1#1", lease_seconds=3600)
    assert isinstance(await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60), Busy)
    async with sql._store.sessions.begin() as session:
        past = (
            "statement_timestamp() - interval '1 second'"
            if session.get_bind().dialect.name == "postgresql"
            else "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds') || '000'"
        )
        await session.execute(
            text(f"UPDATE idempotency_record SET lease_expires_at = {past} WHERE key = :k"),
            {"k": key},
        )
    assert await sql.claim(key, tool_name="t", owner="c2#1", lease_seconds=60) == Acquired()
