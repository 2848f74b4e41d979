"""Acceptance scenarios 1-39 of the guardrails spec, run against ``ToolDispatcher`` directly.

Spec: ``guardrails-idempotency-access.md`` §10 (plus §2, §5, §6, §7, §8). Setup as in §10: a
``SpyStore`` counting store calls around ``InMemoryIdempotencyStore(clock=FakeClock())``, an
``InMemoryAuditLog``, ``AccessConfig.allow_all(Principal("p1"))`` and ``runs`` counters.

After the scenarios: two "workers" (dispatchers on separate SQL engines) racing on one key, on
SQLite and PostgreSQL, and hypothesis properties for key equivalence and for guardrail
rejections never touching the store.

Note on §5.2: the spec's helper is ``derive_key(tool, arguments, principal=None)``; the product
offers ``derive_key(tool_name, snapshot_or_model, *, policy, principal_id)``. Scenario 14 tests
the key through dispatch and through the existing function.
"""

import asyncio
import copy
import hashlib
import json
import math
import re
import types
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from tests.support.clock import T0, FakeClock
from tooltrail.core.wire import TurnInput
from tooltrail.db.idempotency import SqlIdempotencyStore
from tooltrail.db.store import AuditStore
from tooltrail.errors import DuplicateToolError, RegistryFrozenError
from tooltrail.pipeline.dispatcher import DispatchResult, InMemoryAuditLog, ToolDispatcher
from tooltrail.tools import (
    ArgumentsRejected,
    Tool,
    ToolContext,
    ToolRegistry,
    UnknownToolError,
    tool,
)
from tooltrail.tools.access import (
    AccessConfig,
    AccessConfigFrozenError,
    AccessDecision,
    AccessRequest,
    AuthorityScope,
    Principal,
)
from tooltrail.tools.guards import Guard, InputGuard, ToolDefaults, tool_defaults
from tooltrail.tools.idempotency import (
    Acquired,
    CachedToolError,
    Claim,
    CompleteHook,
    Idempotency,
    IdempotencyKeyError,
    IdempotencyStoreUnavailable,
    InMemoryIdempotencyStore,
    StoredOutcome,
    derive_key,
)

P1 = Principal("p1")
ALLOW_P1 = AccessConfig.allow_all(P1)
GUARDRAIL = "guardrail violation: "

_T = TypeVar("_T")


# -- setup of §10 -----------------------------------------------------------------------------


class SpyStore:
    """Counts every call into the wrapped store (``calls``), by method (``counts``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    @property
    def calls(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()

    async def claim(self, key: str, *, tool_name: str, owner: str, lease_seconds: float) -> Claim:
        self.counts["claim"] += 1
        result: Claim = await self.inner.claim(
            key, tool_name=tool_name, owner=owner, lease_seconds=lease_seconds
        )
        return result

    async def renew(self, key: str, *, owner: str, lease_seconds: float) -> bool:
        self.counts["renew"] += 1
        return bool(await self.inner.renew(key, owner=owner, lease_seconds=lease_seconds))

    async def complete(
        self,
        key: str,
        *,
        owner: str,
        outcome: StoredOutcome,
        ttl_seconds: int,
        also: CompleteHook | None = None,
    ) -> bool:
        self.counts["complete"] += 1
        return bool(
            await self.inner.complete(
                key, owner=owner, outcome=outcome, ttl_seconds=ttl_seconds, also=also
            )
        )

    async def release(self, key: str, *, owner: str) -> None:
        self.counts["release"] += 1
        await self.inner.release(key, owner=owner)

    async def get(self, key: str) -> StoredOutcome | None:
        self.counts["get"] += 1
        outcome: StoredOutcome | None = await self.inner.get(key)
        return outcome

    async def put(self, key: str, outcome: StoredOutcome, *, ttl_seconds: int) -> None:
        self.counts["put"] += 1
        await self.inner.put(key, outcome, ttl_seconds=ttl_seconds)


class Env:
    """The §10 setup: ``reg``, ``clock``, ``store`` (a spy), ``audit`` and dispatcher ``d``."""

    def __init__(
        self,
        *tools: Tool,
        access: AccessConfig | None = ALLOW_P1,
        store: SpyStore | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        self.reg = ToolRegistry(tools)
        self.clock = clock or FakeClock()
        self.store = store or SpyStore(InMemoryIdempotencyStore(clock=self.clock))
        self.audit = InMemoryAuditLog()
        self.d = ToolDispatcher(self.reg, store=self.store, audit=self.audit, access=access)

    async def call(
        self, name: str, args: dict[str, Any] | None, call_id: str = "c1", attempt: int = 1
    ) -> DispatchResult:
        return await self.d.dispatch(name, args, call_id=call_id, attempt=attempt)

    def statuses(self) -> list[str]:
        return [row.status for row in self.audit.rows]


runs: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    runs.clear()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> bytes:
    """The spec's §4.3 formula, verbatim."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def spec_key(tool_name: str, scope_id: str | None, material: str) -> str:
    """The spec's §5.2 formula, verbatim."""
    return hashlib.sha256(
        canonical_json(["tooltrail-idem/1", tool_name, scope_id, material])
    ).hexdigest()


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine on a private loop (hypothesis examples are sync functions)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` (counters of spies and bodies) until it holds."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110  (plain counters, no event to wait on)
            await asyncio.sleep(0.005)


# -- tools shared by several scenarios -------------------------------------------------------


@tool(idempotent=True)
async def t(a: int) -> dict[str, int]:
    runs["t"] += 1
    return {"a": a}


@tool(name="t")
async def t_plain(a: int) -> dict[str, int]:
    runs["t"] += 1
    return {"a": a}


# -- 1-3: resolution and registration --------------------------------------------------------


async def test_scenario_01_unknown_name_raises_without_store_or_audit() -> None:
    env = Env()
    with pytest.raises(UnknownToolError) as info:
        await env.call("nope", {})
    assert isinstance(info.value, KeyError)
    assert str(info.value) == "unknown tool: 'nope'"
    assert info.value.tool_name == "nope"
    assert env.store.calls == 0
    assert env.audit.rows == []


async def test_scenario_01_names_match_exactly_and_case_sensitively() -> None:
    env = Env(t)
    for name in ("T", " t", "t "):
        with pytest.raises(UnknownToolError):
            await env.call(name, {"a": 1})
    assert runs["t"] == 0
    assert env.audit.rows == []


async def test_scenario_02_lookup_returns_the_tool_or_none_and_runs_nothing() -> None:
    env = Env(t)
    assert env.d.lookup("nope") is None
    assert env.d.lookup("t") is env.reg.lookup("t")
    assert isinstance(env.d.lookup("t"), Tool)
    assert runs["t"] == 0
    assert env.store.calls == 0
    assert env.audit.rows == []


async def test_scenario_03_dynamic_duplicate_of_a_static_tool_fails_at_once() -> None:
    @tool
    def x() -> str:
        return "static"

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return "dynamic"

    reg = ToolRegistry([x])
    with pytest.raises(DuplicateToolError, match="'x'") as info:
        reg.register_dynamic("x", description="d", parameters={"type": "object"}, handler=handler)
    assert isinstance(info.value, ValueError)
    assert reg.lookup("x") is x
    # ... and the other way round.
    reg2 = ToolRegistry()
    reg2.register_dynamic("x", description="d", parameters={"type": "object"}, handler=handler)
    with pytest.raises(DuplicateToolError, match="'x'"):
        reg2.register(x)


# -- 4-5: catalog ----------------------------------------------------------------------------


def _has_generated_title(schema: Any) -> bool:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                return True
            if key == "properties" and isinstance(value, dict):
                if any(_has_generated_title(sub) for sub in value.values()):
                    return True
            elif key not in ("default", "enum", "const", "examples") and _has_generated_title(
                value
            ):
                return True
    if isinstance(schema, list):
        return any(_has_generated_title(item) for item in schema)
    return False


async def test_scenario_04_catalog_schema_required_defaults_no_titles_sorted() -> None:
    @tool
    def zeta(q: str) -> str:
        return q

    @tool
    def get_weather(city: Annotated[str, Field(description="City")], unit: str = "C") -> str:
        """Get the weather."""
        return city

    @tool
    def alpha() -> str:
        return ""

    reg = ToolRegistry([zeta, get_weather, alpha])
    openai = reg.openai_tools()
    assert [entry["function"]["name"] for entry in openai] == ["alpha", "get_weather", "zeta"]
    weather = openai[1]["function"]
    params = weather["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["city"]
    assert params["properties"]["unit"]["default"] == "C"
    assert params["properties"]["city"]["description"] == "City"
    assert not _has_generated_title(params)
    assert "additionalProperties" not in params
    assert weather["description"] == "Get the weather."
    anthropic = reg.anthropic_tools()
    assert [entry["name"] for entry in anthropic] == ["alpha", "get_weather", "zeta"]
    for a_entry, o_entry in zip(anthropic, openai, strict=True):
        assert a_entry["input_schema"] == o_entry["function"]["parameters"]
        assert a_entry["description"] == o_entry["function"]["description"]
    assert openai[0]["function"]["parameters"] == {"type": "object", "properties": {}}


SECRET_GUARD = Guard(max_length=5, blocked_patterns=(r"secret",))


async def test_scenario_05_schema_shows_max_length_but_not_patterns() -> None:
    @tool
    def g(text: Annotated[str, SECRET_GUARD]) -> str:
        return text

    schema = g.parameters_schema()
    assert schema["properties"]["text"]["maxLength"] == 5
    assert "secret" not in json.dumps(ToolRegistry([g]).openai_tools())
    assert "pattern" not in json.dumps(schema)


# -- 6-11: guardrails ------------------------------------------------------------------------


@tool(idempotent=True)
async def g(text: Annotated[str, SECRET_GUARD]) -> str:
    runs["g"] += 1
    return text


async def test_scenario_06_guard_rejections_are_soft_and_never_echo_the_value() -> None:
    env = Env(g)
    long = await env.call("g", {"text": "toolong"}, call_id="c1")
    blocked = await env.call("g", {"text": "secret"}, call_id="c2")
    assert long.text == "guardrail violation: text: longer than 5 characters"
    assert blocked.text == "guardrail violation: text: matches a blocked pattern"
    for result, value in ((long, "toolong"), (blocked, "secret")):
        assert result.status == "guardrail_violation"
        assert result.is_error is True
        assert result.text is not None and result.text.startswith(GUARDRAIL)
        assert value not in result.text
        assert result.value is None
        assert result.idempotency_key is None
    assert runs["g"] == 0
    assert env.store.calls == 0
    # §4.4: one guardrail_violation audit row per rejection, with no snapshot.
    assert env.statuses() == ["guardrail_violation", "guardrail_violation"]
    first = env.audit.rows[0]
    assert (first.call_id, first.attempt, first.tool_name, first.tool_kind) == (
        "c1",
        1,
        "g",
        "static",
    )
    assert first.principal_id == "p1"
    assert first.raw_arguments == {"text": "toolong"}
    assert first.effective_arguments is None
    assert first.idempotency_key is None
    assert first.text == long.text
    # Within the limits the tool runs.
    ok = await env.call("g", {"text": "fine"}, call_id="c3")
    assert (ok.status, ok.value, runs["g"]) == ("ok", "fine", 1)


async def test_scenario_06_several_violations_in_declaration_order() -> None:
    @tool(idempotent=True)
    async def two(text: Annotated[str, Guard(max_length=5)], n: int) -> str:
        runs["two"] += 1
        return text

    env = Env(two)
    result = await env.call("two", {"n": "abc", "text": "toolong"})
    # 3a stops the long text before any coercion work is spent on n.
    assert result.text == "guardrail violation: text: longer than 5 characters"
    result = await env.call("two", {"n": "abc", "text": "ok"})
    assert result.text == "guardrail violation: n: not a valid integer"
    assert (runs["two"], env.store.calls) == (0, 0)


async def test_scenario_07_a_default_that_breaks_a_limit_is_rejected_in_3c() -> None:
    @tool(idempotent=True)
    async def lab(label: Annotated[str, Guard(max_length=5)] = "defaultlabel") -> str:
        runs["lab"] += 1
        return label

    env = Env(lab)
    with pytest.raises(ArgumentsRejected) as info:
        lab.validate({})
    assert info.value.stage == "effective"  # 3a passed, 3c rejected
    result = await env.call("lab", {})
    assert result.status == "guardrail_violation"
    assert result.text == "guardrail violation: label: longer than 5 characters"
    assert (runs["lab"], env.store.calls) == (0, 0)


async def test_scenario_08_coercion_failure_of_an_unguarded_tool_is_a_violation() -> None:
    @tool(idempotent=True)
    async def num(n: int) -> int:
        runs["num"] += 1
        return n

    env = Env(num)
    result = await env.call("num", {"n": "abc"})
    assert result.status == "guardrail_violation"
    assert result.text == "guardrail violation: n: not a valid integer"
    assert "abc" not in result.text
    missing = await env.call("num", {})
    assert missing.text == "guardrail violation: n: field required"
    assert (runs["num"], env.store.calls) == (0, 0)
    assert env.statuses() == ["guardrail_violation", "guardrail_violation"]


class CountingNow:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> datetime:
        self.calls += 1
        return datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)


async def test_scenario_09_default_factory_runs_once_per_dispatch() -> None:
    counting_now = CountingNow()
    seen: list[datetime] = []

    @tool(idempotent=True)
    async def stamp(when: datetime = Field(default_factory=counting_now)) -> str:  # noqa: B008
        runs["stamp"] += 1
        seen.append(when)
        return when.isoformat()

    env = Env(stamp)
    result = await env.call("stamp", {})
    assert result.status == "ok"
    assert counting_now.calls == 1, "key, audit row and body reuse the one materialization"
    assert seen == [datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)]
    row = env.audit.rows[0]
    assert row.effective_arguments == '{"when":"2026-05-06T07:08:09Z"}'
    assert result.idempotency_key == spec_key("stamp", "p1", '{"when":"2026-05-06T07:08:09Z"}')
    assert row.idempotency_key == result.idempotency_key


async def test_scenario_10_explicit_none_differs_from_an_absent_key() -> None:
    seen: list[str | None] = []

    @tool(idempotent=True)
    async def opt(p: str | None = "x") -> str:
        runs["opt"] += 1
        seen.append(p)
        return repr(p)

    @tool(idempotent=True)
    async def opt_none(p: str | None = None) -> str:
        runs["opt_none"] += 1
        return repr(p)

    env = Env(opt, opt_none)
    first = await env.call("opt", {"p": None}, call_id="c1")
    second = await env.call("opt", {}, call_id="c2")
    assert seen == [None, "x"]
    assert runs["opt"] == 2
    assert (first.status, second.status) == ("ok", "ok")
    assert first.idempotency_key != second.idempotency_key
    # With a None default both spellings are one snapshot.
    await env.call("opt_none", {"p": None}, call_id="c3")
    hit = await env.call("opt_none", {}, call_id="c4")
    assert (runs["opt_none"], hit.status) == (1, "cache_hit")


async def test_scenario_11_the_body_cannot_alter_the_snapshot() -> None:
    @tool(idempotent=True)
    async def tagger(tags: list[str]) -> list[str]:
        runs["tagger"] += 1
        tags.append("mutated")
        return tags

    env = Env(tagger)
    raw = {"tags": ["a"]}
    first = await env.call("tagger", raw, call_id="c1")
    second = await env.call("tagger", raw, call_id="c2")
    assert raw == {"tags": ["a"]}, "the caller's arguments are untouched"
    assert (first.status, second.status) == ("ok", "cache_hit")
    assert first.value == second.value == ["a", "mutated"]
    assert runs["tagger"] == 1
    assert [row.effective_arguments for row in env.audit.rows] == ['{"tags":["a"]}'] * 2
    assert [row.raw_arguments for row in env.audit.rows] == [{"tags": ["a"]}] * 2


# -- 12-19: keys and policies ----------------------------------------------------------------


@tool(idempotent=True)
async def f(unit: str = "C", n: int = 0) -> str:
    runs["f"] += 1
    return f"{n}{unit}"


async def test_scenario_12_defaults_and_coercions_give_one_key() -> None:
    env = Env(f)
    variants: list[dict[str, Any]] = [{}, {"unit": "C"}, {"n": "0"}, {"n": 0, "unit": "C"}]
    results = [await env.call("f", v, call_id=f"c{i}") for i, v in enumerate(variants)]
    assert runs["f"] == 1
    assert [r.status for r in results] == ["ok", "cache_hit", "cache_hit", "cache_hit"]
    assert len({r.idempotency_key for r in results}) == 1
    assert {r.source_call_id for r in results[1:]} == {"c0"}


@tool(idempotent=True)
async def ab(a: int, b: int) -> int:
    runs["ab"] += 1
    return a + b


async def test_scenario_13_key_order_does_not_matter_values_do() -> None:
    env = Env(ab)
    await env.call("ab", {"a": 1, "b": 2}, call_id="c1")
    await env.call("ab", {"b": 2, "a": 1}, call_id="c2")
    await env.call("ab", {"a": 2, "b": 2}, call_id="c3")
    assert runs["ab"] == 2
    assert env.statuses() == ["ok", "cache_hit", "ok"]


async def test_scenario_14_key_formula() -> None:
    expected = spec_key("t", "p1", '{"a":1}')
    assert expected == sha('["tooltrail-idem/1","t","p1","{\\"a\\":1}"]')
    # Through the existing helper (snapshot-based signature) ...
    snapshot = t.validate({"a": 1})
    assert derive_key("t", snapshot, policy=Idempotency(), principal_id="p1") == expected
    assert derive_key("t", snapshot.model, policy=Idempotency(), principal_id="p1") == expected
    # ... and through dispatch.
    env = Env(t)
    result = await env.call("t", {"a": "1"})
    assert result.idempotency_key == expected
    assert env.audit.rows[0].idempotency_key == expected
    # The tool name is part of the key; the global scope hashes null.
    assert spec_key("u", "p1", '{"a":1}') != expected
    assert derive_key("t", snapshot, policy=Idempotency(scope="global"), principal_id="p1") == (
        spec_key("t", None, '{"a":1}')
    )


def test_scenario_14_spec_signature_of_derive_key() -> None:
    spec_derive: Callable[..., str] = derive_key
    key = spec_derive(t, {"a": 1}, principal=Principal("p1"))
    assert key == spec_key("t", "p1", '{"a":1}')


async def test_scenario_15_a_put_outcome_is_honoured_like_a_produced_one() -> None:
    env = Env(t)
    k = spec_key("t", "p1", '{"a":1}')
    await env.store.put(
        k, StoredOutcome(ok=True, value="CACHED", source_call_id="c0"), ttl_seconds=60
    )
    result = await env.call("t", {"a": 1}, call_id="c9")
    assert result.status == "cache_hit"
    assert result.is_error is False
    assert result.value == "CACHED"
    assert result.source_call_id == "c0"
    assert runs["t"] == 0
    row = env.audit.rows[0]
    assert (row.call_id, row.status, row.source_call_id, row.value) == (
        "c9",
        "cache_hit",
        "c0",
        "CACHED",
    )


async def test_scenario_16_non_idempotent_tools_never_touch_the_store() -> None:
    @tool(name="plain")
    async def plain(a: int) -> int:
        runs["plain"] += 1
        return a

    @tool(idempotent=Idempotency(strategy="none"))
    async def none_strategy(a: int) -> int:
        runs["none_strategy"] += 1
        return a

    env = Env(plain, none_strategy)
    for name in ("plain", "none_strategy"):
        for i in range(2):
            result = await env.call(name, {"a": 1}, call_id=f"{name}{i}")
            assert (result.status, result.idempotency_key) == ("ok", None)
    assert (runs["plain"], runs["none_strategy"]) == (2, 2)
    assert env.store.calls == 0


@tool_defaults(idempotent=True)
class Kit:
    """A toolkit whose tools are idempotent by default."""

    @tool
    async def kit_a(self, n: int) -> int:
        runs["a"] += 1
        return n

    @tool(idempotent=False)
    async def kit_b(self, n: int) -> int:
        runs["b"] += 1
        return n


async def test_scenario_17_class_default_and_method_override() -> None:
    env = Env()
    env.reg.register_toolkit(Kit())
    for name in ("kit_a", "kit_b"):
        for i in range(2):
            await env.call(name, {"n": 1}, call_id=f"{name}{i}")
    assert (runs["a"], runs["b"]) == (1, 2)


_MODULE_SOURCE = """
from tooltrail import tool
from tooltrail.tools.guards import ToolDefaults

TOOLTRAIL_DEFAULTS = ToolDefaults(idempotent=True)


@tool
async def mod_tool(n: int) -> int:
    RUNS["mod_tool"] += 1
    return n


@tool(idempotent=False)
async def mod_opt_out(n: int) -> int:
    RUNS["mod_opt_out"] += 1
    return n
"""


async def test_scenario_18_module_defaults() -> None:
    mod = types.ModuleType("scenario18_tools")
    mod.__dict__["RUNS"] = runs
    exec(compile(_MODULE_SOURCE, "<scenario18_tools>", "exec"), mod.__dict__)
    assert isinstance(mod.__dict__["TOOLTRAIL_DEFAULTS"], ToolDefaults)
    env = Env()
    added = env.reg.register_module(mod)
    assert [item.name for item in added] == ["mod_tool", "mod_opt_out"]
    for name in ("mod_tool", "mod_opt_out"):
        for i in range(2):
            await env.call(name, {"n": 3}, call_id=f"{name}{i}")
    assert runs["mod_tool"] == 1
    assert runs["mod_opt_out"] == 2


class Issue(BaseModel):
    title: str


async def test_scenario_19_explicit_key_function() -> None:
    # The spec's key=lambda m: m.title.strip().lower(), spelled so the type checker sees str.
    policy = Idempotency(strategy="explicit", key=lambda m: m.model_dump()["title"].strip().lower())

    @tool(idempotent=policy)
    async def file_issue(issue: Issue) -> str:
        runs["file_issue"] += 1
        return issue.title

    env = Env(file_issue)
    first = await env.call("file_issue", {"title": "Bug"}, call_id="c1")
    second = await env.call("file_issue", {"title": " bug "}, call_id="c2")
    assert runs["file_issue"] == 1
    assert (first.status, second.status) == ("ok", "cache_hit")
    assert second.value == "Bug"
    assert first.idempotency_key == spec_key("file_issue", "p1", "bug")


async def test_explicit_key_failure_raises_idempotency_key_error() -> None:
    # §5.2 and §7: the dispatcher raises IdempotencyKeyError; the body does not run and the
    # store is untouched.
    def broken(model: BaseModel) -> str:
        raise RuntimeError("no key")

    @tool(idempotent=Idempotency(strategy="explicit", key=broken))
    async def raising_key(a: int) -> int:
        runs["raising_key"] += 1
        return a

    @tool(idempotent=Idempotency(strategy="explicit", key=lambda m: ""))
    async def empty_key(a: int) -> int:
        runs["empty_key"] += 1
        return a

    env = Env(raising_key, empty_key)
    with pytest.raises(IdempotencyKeyError, match="raised RuntimeError: no key"):
        await env.call("raising_key", {"a": 1})
    with pytest.raises(IdempotencyKeyError, match="non-empty str"):
        await env.call("empty_key", {"a": 1})
    assert (runs["raising_key"], runs["empty_key"], env.store.calls) == (0, 0, 0)
    # §8: the call passed step 1, so it still has its one audit row.
    assert env.statuses() == ["tool_error", "tool_error"]


# -- 20-26: resolution -----------------------------------------------------------------------


async def test_scenario_20_failures_are_not_cached_by_default() -> None:
    exc = ConnectionError("flaky")
    failures = [exc]

    @tool(idempotent=True)
    async def flaky(a: int) -> str:
        runs["flaky"] += 1
        if failures:
            raise failures.pop()
        return "done"

    env = Env(flaky)
    with pytest.raises(ConnectionError) as info:
        await env.call("flaky", {"a": 1}, call_id="c1")
    assert info.value is exc
    second = await env.call("flaky", {"a": 1}, call_id="c2")
    assert (second.status, second.value) == ("ok", "done")
    assert runs["flaky"] == 2
    assert env.statuses() == ["tool_error", "ok"]
    assert env.audit.rows[0].text == "ConnectionError: flaky"


async def test_scenario_21_cached_failures() -> None:
    exc = ValueError("boom")

    @tool(idempotent=Idempotency(cache_failures=True))
    async def boom(a: int) -> str:
        runs["boom"] += 1
        raise exc

    env = Env(boom)
    with pytest.raises(ValueError, match="boom") as first:
        await env.call("boom", {"a": 1}, call_id="c1")
    assert first.value is exc
    with pytest.raises(CachedToolError) as second:
        await env.call("boom", {"a": 1}, call_id="c2")
    assert (second.value.error_type, second.value.message) == ("ValueError", "boom")
    assert second.value.source_call_id == "c1"
    assert runs["boom"] == 1
    assert env.audit.rows[1].call_id == "c2"
    assert env.audit.rows[1].source_call_id == "c1"


async def test_scenario_22_ttl_counts_from_completion() -> None:
    env = Env(t)
    await env.call("t", {"a": 1}, call_id="c1")
    env.clock.advance(3599)
    hit = await env.call("t", {"a": 1}, call_id="c2")
    assert hit.status == "cache_hit"
    env.clock.advance(2)
    again = await env.call("t", {"a": 1}, call_id="c3")
    assert again.status == "ok"
    assert runs["t"] == 2


async def test_scenario_23_keys_are_scoped_to_the_principal_by_default() -> None:
    @tool(idempotent=Idempotency(scope="global"))
    async def glob(a: int) -> int:
        runs["glob"] += 1
        return a

    clock = FakeClock()
    store = SpyStore(InMemoryIdempotencyStore(clock=clock))
    reg = ToolRegistry([t, glob])
    d1 = ToolDispatcher(reg, store=store, access=AccessConfig.allow_all(Principal("p1")))
    d2 = ToolDispatcher(reg, store=store, access=AccessConfig.allow_all(Principal("p2")))
    d1b = ToolDispatcher(reg, store=store, access=AccessConfig.allow_all(Principal("p1")))
    await d1.dispatch("t", {"a": 1}, call_id="c1")
    other = await d2.dispatch("t", {"a": 1}, call_id="c2")
    assert (runs["t"], other.status) == (2, "ok")
    same = await d1b.dispatch("t", {"a": 1}, call_id="c3")
    assert (runs["t"], same.status, same.source_call_id) == (2, "cache_hit", "c1")
    await d1.dispatch("glob", {"a": 1}, call_id="g1")
    shared = await d2.dispatch("glob", {"a": 1}, call_id="g2")
    assert (runs["glob"], shared.status, shared.source_call_id) == (1, "cache_hit", "g1")


async def test_scenario_24_concurrent_identical_calls_run_once() -> None:
    release = asyncio.Event()

    @tool(idempotent=True)
    async def slow(a: int) -> dict[str, int]:
        runs["slow"] += 1
        await release.wait()
        return {"a": a}

    env = Env(slow)
    first = asyncio.create_task(env.call("slow", {"a": 1}, call_id="c1"))
    second = asyncio.create_task(env.call("slow", {"a": 1}, call_id="c2"))
    # The second call found the claim busy at least once before the body is let go.
    await until(lambda: runs["slow"] == 1 and env.store.counts["claim"] >= 2)
    release.set()
    r1, r2 = await asyncio.gather(first, second)
    assert runs["slow"] == 1
    assert (r1.status, r2.status) == ("ok", "cache_hit")
    assert r2.source_call_id == "c1"
    assert r1.value == r2.value == {"a": 1}
    assert sorted((row.call_id, row.status) for row in env.audit.rows) == [
        ("c1", "ok"),
        ("c2", "cache_hit"),
    ]


async def test_scenario_25_busy_after_the_wait_timeout() -> None:
    @tool(idempotent=Idempotency(lease_seconds=0.3, wait_timeout_seconds=0.5))
    async def forever(a: int) -> str:
        runs["forever"] += 1
        await asyncio.Event().wait()
        return "never"

    env = Env(forever, store=SpyStore(InMemoryIdempotencyStore()))  # a real-clock store
    owner = asyncio.create_task(env.call("forever", {"a": 1}, call_id="c1"))
    await until(lambda: runs["forever"] == 1)
    busy = await env.call("forever", {"a": 1}, call_id="c2")
    assert busy.status == "idempotency_busy"
    assert busy.is_error is True
    assert busy.text == (
        "idempotency busy: tool 'forever' is already running with the same arguments; "
        "gave up after 0.5s"
    )
    assert runs["forever"] == 1
    assert env.store.counts["renew"] >= 1, "the owner kept its lease alive"
    assert env.store.counts["complete"] == 0, "the waiter wrote nothing to the store"
    assert [(row.call_id, row.status) for row in env.audit.rows] == [("c2", "idempotency_busy")]
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert busy.idempotency_key is not None
    assert await env.store.inner.record(busy.idempotency_key) is None, "released on cancel"


async def test_scenario_26_an_expired_claim_is_taken_over() -> None:
    env = Env(t)
    k = spec_key("t", "p1", '{"a":1}')
    assert await env.store.claim(k, tool_name="t", owner="dead#1", lease_seconds=60) == Acquired()
    env.clock.advance(61)
    result = await env.call("t", {"a": 1}, call_id="c2")
    assert result.status == "ok"
    assert runs["t"] == 1
    row = await env.store.inner.record(k)
    assert row is not None
    assert (row.owner, row.state, row.source_call_id) == ("c2#1", "succeeded", "c2")


async def test_scenario_26_a_live_claim_is_not_taken_over() -> None:
    @tool(idempotent=Idempotency(lease_seconds=60, wait_timeout_seconds=60))
    async def held(a: int) -> int:
        runs["held"] += 1
        return a

    env = Env(held)
    k = spec_key("held", "p1", '{"a":1}')
    await env.store.inner.claim(k, tool_name="held", owner="alive#1", lease_seconds=60)
    env.clock.advance(59)
    task = asyncio.create_task(env.call("held", {"a": 1}, call_id="c2"))
    await until(lambda: env.store.counts["claim"] >= 2)
    assert runs["held"] == 0
    env.clock.advance(2)  # the owner died: its lease lapses, and the waiter takes over
    result = await task
    assert (result.status, runs["held"]) == ("ok", 1)


# -- 27-29: the durable twist, audit of hits, guardrails before the cache --------------------


# Scenario 27 end to end (attempt 1 commits its outcome and the worker dies; attempt 2 must be
# a cache hit) needs Temporal:
# tests/runtime/test_crash.py::test_crash_after_an_idempotent_outcome_committed.
async def test_scenario_27_dispatcher_level_attempt_2_finds_the_outcome() -> None:
    # What the Temporal test checks end to end, at the dispatcher: same call id, attempt 2.
    env = Env(t)
    await env.call("t", {"a": 5}, call_id="c1", attempt=1)
    second = await env.call("t", {"a": 5}, call_id="c1", attempt=2)
    assert runs["t"] == 1
    first, hit = env.audit.rows
    assert (first.call_id, first.attempt, first.status) == ("c1", 1, "ok")
    assert (hit.call_id, hit.attempt, hit.status, hit.source_call_id) == (
        "c1",
        2,
        "cache_hit",
        "c1",
    )
    assert second.source_call_id == "c1"


async def test_scenario_28_a_hit_is_audited_under_the_requesting_call() -> None:
    env = Env(t)
    await env.call("t", {"a": 1}, call_id="c1")
    await env.call("t", {"a": 1}, call_id="c2", attempt=3)
    row = env.audit.rows[1]
    assert (row.call_id, row.attempt, row.status, row.source_call_id) == (
        "c2",
        3,
        "cache_hit",
        "c1",
    )
    assert row.value == {"a": 1}
    assert row.effective_arguments == '{"a":1}'
    assert row.lease_lost is False
    assert row.started_at <= row.finished_at


async def test_scenario_29_guardrails_run_before_the_cache() -> None:
    @tool(idempotent=True)
    async def short(text: Annotated[str, Guard(max_length=5)]) -> str:
        runs["short"] += 1
        return text

    env = Env(short)
    k = spec_key("short", "p1", '{"text":"toolong"}')
    await env.store.inner.put(
        k, StoredOutcome(ok=True, value="CACHED", source_call_id="c0"), ttl_seconds=60
    )
    result = await env.call("short", {"text": "toolong"})
    assert result.status == "guardrail_violation"
    assert result.text == "guardrail violation: text: longer than 5 characters"
    assert result.value is None
    assert (runs["short"], env.store.calls) == (0, 0)


# -- 30-31: dynamic tools --------------------------------------------------------------------


async def test_scenario_30_dynamic_tools_skip_guardrails_and_idempotency() -> None:
    received: list[dict[str, Any]] = []

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        runs["remote"] += 1
        received.append(copy.deepcopy(arguments))
        arguments["x"] = "mutated by the handler"
        return {"echo": arguments["extra"], "key": ctx.idempotency_key}

    env = Env()
    env.reg.register_dynamic(
        "remote",
        description="A remote tool",
        parameters={
            "type": "object",
            "properties": {"x": {"type": "string", "maxLength": 3}},
            "additionalProperties": False,
        },
        handler=handler,
    )
    raw = {"x": "way too long", "extra": 1}
    results = [await env.call("remote", raw, call_id=f"c{i}") for i in range(2)]
    assert received == [raw, raw]
    assert raw == {"x": "way too long", "extra": 1}
    assert [r.status for r in results] == ["ok", "ok"]
    assert all(r.value == {"echo": 1, "key": None} for r in results)
    assert runs["remote"] == 2
    assert env.store.calls == 0
    row = env.audit.rows[0]
    assert (row.tool_kind, row.effective_arguments, row.idempotency_key) == ("dynamic", None, None)
    assert row.raw_arguments == {"x": "way too long", "extra": 1}


async def test_scenario_31_dynamic_tools_refuse_idempotent_and_guard() -> None:
    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return None

    reg = ToolRegistry()
    with pytest.raises(TypeError):
        reg.register_dynamic(
            "d1", description="", parameters={"type": "object"}, handler=handler, idempotent=True
        )
    with pytest.raises(TypeError):
        reg.register_dynamic(
            "d2",
            description="",
            parameters={"type": "object"},
            handler=handler,
            guard=InputGuard(),
        )
    assert len(reg) == 0


# -- 32-37: access gate ----------------------------------------------------------------------


async def test_scenario_32_no_gate_runs_but_a_gate_without_principal_fails_closed() -> None:
    env = Env(t, access=None)
    result = await env.call("t", {"a": 1})
    assert (result.status, runs["t"]) == ("ok", 1)
    assert env.audit.rows[0].principal_id is None

    closed = Env(t, access=AccessConfig(principal=None, authority=AuthorityScope.all()))
    denied = await closed.call("t", {"a": 1})
    assert denied.status == "access_denied"
    assert denied.is_error is True
    assert denied.text == "access denied: no principal configured"
    assert runs["t"] == 1
    assert closed.store.calls == 0
    assert [(row.status, row.text) for row in closed.audit.rows] == [
        ("access_denied", "access denied: no principal configured")
    ]


async def test_scenario_33_the_gate_runs_before_guardrails_and_deny_wins() -> None:
    @tool(idempotent=True)
    async def send_email(to: str) -> str:
        runs["send_email"] += 1
        return to

    @tool(idempotent=True)
    async def num(n: int) -> int:
        runs["num"] += 1
        return n

    lacking = Env(num, access=AccessConfig(P1, AuthorityScope(allowed_tools={"other"})))
    result = await lacking.call("num", {"n": "abc"})
    assert result.status == "access_denied"
    assert result.text == "access denied: tool 'num' is outside the authority of principal 'p1'"
    row = lacking.audit.rows[0]
    assert (row.status, row.principal_id, row.effective_arguments) == ("access_denied", "p1", None)

    deny = AccessConfig(P1, AuthorityScope(allowed_tools={"*"}, denied_tools={"send_*"}))
    env = Env(send_email, num, access=deny)
    denied = await env.call("send_email", {"to": "x"})
    assert denied.text == "access denied: tool 'send_email' is denied for principal 'p1'"
    allowed = await env.call("num", {"n": 2})
    assert allowed.status == "ok"
    assert (runs["send_email"], runs["num"]) == (0, 1)
    assert lacking.store.calls == 0


async def test_scenario_34_identity_never_comes_from_arguments_or_input() -> None:
    @tool
    async def admin_op(principal: str) -> str:
        runs["admin_op"] += 1
        return principal

    env = Env(admin_op, access=AccessConfig(P1, AuthorityScope(allowed_tools={"read_*"})))
    result = await env.call("admin_op", {"principal": "root"})
    assert result.text == (
        "access denied: tool 'admin_op' is outside the authority of principal 'p1'"
    )
    assert env.audit.rows[0].principal_id == "p1"
    assert runs["admin_op"] == 0
    # A turn's input with a smuggled principal: the wire model drops the field. (Starting the
    # turn workflow is covered by tests/workflows/test_dispatch_workflow.py::
    # test_the_access_gate_uses_host_identity_only.)
    turn = TurnInput.model_validate(
        {"session_id": "s", "calls": [], "advertised": [], "principal": "root"}
    )
    assert "principal" not in turn.model_dump()
    assert not hasattr(turn, "principal")


class RaisingGate:
    async def check(self, request: AccessRequest) -> AccessDecision:
        raise RuntimeError("gate is down")


class ArgumentGate:
    """Denies calls whose raw ``to`` argument is the CEO (reads raw arguments only)."""

    async def check(self, request: AccessRequest) -> AccessDecision:
        if request.arguments.get("to") == "ceo@corp":
            return AccessDecision.deny("nobody mails the CEO")
        return AccessDecision.allow("ok")


async def test_scenario_35_preflight_predicts_dispatch_and_has_no_effects() -> None:
    @tool(idempotent=True)
    async def read_file(path: str = "/") -> str:
        runs["read_file"] += 1
        return path

    @tool(guard=InputGuard(max_length=10))
    async def send_email(to: str, body: str = "") -> str:
        runs["send_email"] += 1
        return to

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        runs["remote"] += 1
        return arguments

    configs: list[AccessConfig | None] = [
        None,
        AccessConfig(None, AuthorityScope.all()),
        AccessConfig.allow_all(P1),
        AccessConfig(P1, AuthorityScope(allowed_tools={"read_*", "remote"})),
        AccessConfig(P1, AuthorityScope(allowed_tools={"*"}, denied_tools={"send_*"})),
        AccessConfig(P1, AuthorityScope()),
        AccessConfig(P1, AuthorityScope.all(), gate=RaisingGate()),
        AccessConfig(P1, AuthorityScope.all(), gate=ArgumentGate()),
    ]
    arguments: list[dict[str, Any] | None] = [
        None,
        {},
        {"path": "/x"},
        {"to": "ceo@corp", "body": "x" * 50},
        {"to": "bob"},
        {"principal": "root", "n": "abc"},
    ]
    cells = 0
    for config in configs:
        env = Env(read_file, send_email, access=config)
        env.reg.register_dynamic(
            "remote", description="", parameters={"type": "object"}, handler=handler
        )
        for name in ("read_file", "send_email", "remote"):
            for i, args in enumerate(arguments):
                before = (runs.copy(), env.store.calls, len(env.audit.rows))
                decision = await env.d.authorize_tool(name, args)
                assert (runs.copy(), env.store.calls, len(env.audit.rows)) == before
                result = await env.d.dispatch(name, args, call_id=f"{name}-{i}")
                denied = result.status == "access_denied"
                assert decision.allowed is not denied, (config, name, args, result)
                if denied:
                    assert result.text == decision.error_text
                cells += 1
        with pytest.raises(UnknownToolError):
            await env.d.authorize_tool("nope")
    assert cells == len(configs) * 3 * len(arguments)


async def test_scenario_36_frozen_access_configuration() -> None:
    env = Env(t)
    env.d.configure_access(principal=Principal("p2"))
    assert env.d.access.principal == Principal("p2")
    env.d.freeze()
    with pytest.raises(AccessConfigFrozenError):
        env.d.configure_access(principal=Principal("root"))
    assert env.d.access.principal == Principal("p2")
    with pytest.raises(RegistryFrozenError):
        env.reg.register(f)
    result = await env.call("t", {"a": 1})
    assert (result.status, env.audit.rows[0].principal_id) == ("ok", "p2")


async def test_scenario_37_a_raising_gate_denies() -> None:
    env = Env(t, g, access=AccessConfig(P1, AuthorityScope.all(), gate=RaisingGate()))
    for name, args in (("t", {"a": 1}), ("g", {"text": "secret"})):
        result = await env.call(name, args)
        assert result.status == "access_denied"
        assert result.text == "access denied: gate error (RuntimeError)"
    assert (runs["t"], runs["g"], env.store.calls) == (0, 0, 0)


# -- 38-39 -------------------------------------------------------------------------------------


class DownStore(SpyStore):
    async def claim(self, key: str, *, tool_name: str, owner: str, lease_seconds: float) -> Claim:
        self.counts["claim"] += 1
        raise IdempotencyStoreUnavailable("idempotency store unavailable (claim): down")


async def test_scenario_38_an_unavailable_store_fails_closed() -> None:
    env = Env(t, store=DownStore(InMemoryIdempotencyStore()))
    with pytest.raises(IdempotencyStoreUnavailable):
        await env.call("t", {"a": 1})
    assert runs["t"] == 0


class Weather(BaseModel):
    city: str
    temp: float
    when: datetime


async def test_scenario_39_values_are_json_normalized_on_miss_and_hit() -> None:
    @tool(idempotent=True)
    async def weather(city: str) -> Weather:
        runs["weather"] += 1
        return Weather(city=city, temp=21.5, when=T0)

    env = Env(weather)
    first = await env.call("weather", {"city": "Oslo"}, call_id="c1")
    second = await env.call("weather", {"city": "Oslo"}, call_id="c2")
    assert (first.status, second.status) == ("ok", "cache_hit")
    assert type(first.value) is dict
    assert type(second.value) is dict
    assert (
        first.value
        == second.value
        == {"city": "Oslo", "temp": 21.5, "when": "2026-01-02T03:04:05Z"}
    )
    assert runs["weather"] == 1


# -- §1, §3.6 --------------------------------------------------------------------------------


async def test_construction_and_result_model() -> None:
    with pytest.raises(TypeError):
        ToolDispatcher(None)  # type: ignore[arg-type]
    reg = ToolRegistry([t])
    d1, d2 = ToolDispatcher(reg), ToolDispatcher(reg)
    assert d1.idempotency_store is not d2.idempotency_store, "no process-wide default store"
    assert d1.registry is reg
    await d1.dispatch("t", {"a": 1}, call_id="c1")
    second = await d2.dispatch("t", {"a": 1}, call_id="c2")
    assert (second.status, runs["t"]) == ("ok", 2)
    with pytest.raises(ValueError, match="frozen"):
        second.status = "ok"  # type: ignore[misc]


async def test_none_arguments_mean_empty() -> None:
    env = Env(f)
    result = await env.call("f", None)
    assert (result.status, result.value) == ("ok", "0C")
    assert env.audit.rows[0].raw_arguments == {}


@pytest.mark.parametrize("bad", [["x"], "abc", [("a", 1)], 5])
async def test_non_mapping_arguments_are_a_soft_rejection(bad: Any) -> None:
    # §4.2 3a: the arguments must be a mapping; nothing runs and the store is untouched.
    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        runs["remote"] += 1
        return arguments

    # A gate that reads its arguments as a mapping must not trip over them either.
    for access in (ALLOW_P1, AccessConfig(P1, AuthorityScope.all(), gate=ArgumentGate())):
        env = Env(t, access=access)
        env.reg.register_dynamic("remote", description="", parameters={}, handler=handler)
        for name in ("t", "remote"):
            decision = await env.d.authorize_tool(name, bad)
            result = await env.call(name, bad)
            assert result.status == "guardrail_violation"
            assert result.text == "guardrail violation: (arguments): not a valid object"
            assert decision.allowed is True
        assert (runs["t"], runs["remote"], env.store.calls) == (0, 0, 0)
        assert env.statuses() == ["guardrail_violation"] * 2
        # Step 1 comes first, whatever the arguments are.
        with pytest.raises(UnknownToolError):
            await env.call("nope", bad)


async def test_body_gets_context_with_principal_and_key() -> None:
    seen: list[ToolContext] = []

    @tool(idempotent=True)
    async def ctxtool(a: int, ctx: ToolContext) -> str:
        seen.append(ctx)
        return "x"

    env = Env(ctxtool)
    result = await env.call("ctxtool", {"a": 1, "ctx": "smuggled"}, call_id="c7")
    assert "ctx" not in ctxtool.parameters_schema()["properties"]
    assert seen[0].principal == P1
    assert seen[0].idempotency_key == result.idempotency_key is not None
    assert seen[0].tool_call_id == "c7"
    assert env.audit.rows[0].ignored_arguments == ["ctx"]
    assert env.audit.rows[0].effective_arguments == '{"a":1}'


# -- two workers on one SQL database ---------------------------------------------------------


async def test_two_workers_on_separate_engines_run_the_body_once(db_url: str) -> None:
    release = asyncio.Event()

    @tool(idempotent=Idempotency(lease_seconds=10, wait_timeout_seconds=30))
    async def charge(order: str, amount: int) -> dict[str, Any]:
        runs["charge"] += 1
        await release.wait()
        return {"order": order, "charged": amount}

    engines = [AuditStore(db_url), AuditStore(db_url)]
    try:
        spies = [SpyStore(SqlIdempotencyStore(engine)) for engine in engines]
        workers = [
            ToolDispatcher(ToolRegistry([charge]), store=spy, access=ALLOW_P1) for spy in spies
        ]
        args = {"order": uuid.uuid4().hex, "amount": 5}  # the PostgreSQL database is shared
        tasks = [
            asyncio.create_task(worker.dispatch("charge", args, call_id=f"w{i}"))
            for i, worker in enumerate(workers)
        ]
        # Both have claimed (one won, one saw Busy) before the body may finish.
        await until(
            lambda: runs["charge"] == 1 and sum(s.counts["claim"] for s in spies) >= 3,
            within=20,
        )
        release.set()
        results = await asyncio.gather(*tasks)
    finally:
        for engine in engines:
            await engine.close()
    assert runs["charge"] == 1
    assert sorted(r.status for r in results) == ["cache_hit", "ok"]
    (winner,) = (i for i, r in enumerate(results) if r.status == "ok")
    (loser,) = (r for r in results if r.status == "cache_hit")
    assert loser.source_call_id == f"w{winner}"
    assert results[0].value == results[1].value == {"order": args["order"], "charged": 5}
    assert results[0].idempotency_key == results[1].idempotency_key


# -- properties --------------------------------------------------------------------------------


@tool(idempotent=True)
async def prop(unit: str = "C", n: int = 0, flag: bool = False, ratio: float = 0.5) -> str:
    runs["prop"] += 1
    return f"{unit}{n}{flag}{ratio}"


_DEFAULTS: dict[str, Any] = {"unit": "C", "n": 0, "flag": False, "ratio": 0.5}
_OMIT = object()
_TRUE_SPELLINGS = ("true", "True", "1", "yes", "on", 1, True)
_FALSE_SPELLINGS = ("false", "False", "0", "no", "off", 0, False)


def _spellings(name: str, value: Any) -> list[Any]:
    """Raw spellings of one effective value that pydantic's lax mode turns into it."""
    if name == "n":
        return [value, str(value), float(value)] if abs(value) < 2**53 else [value, str(value)]
    if name == "flag":
        return list(_TRUE_SPELLINGS if value else _FALSE_SPELLINGS)
    if name == "ratio":
        out: list[Any] = [value, repr(value)]
        if value.is_integer() and math.copysign(1.0, value) > 0 and abs(value) < 2**53:
            out.append(int(value))
        return out
    return [value]


@st.composite
def equivalent_inputs(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    values = {
        "unit": draw(st.text(max_size=8)),
        "n": draw(st.integers(min_value=-(10**12), max_value=10**12)),
        "flag": draw(st.booleans()),
        "ratio": draw(st.floats(allow_nan=False, allow_infinity=False)),
    }
    variants: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(min_value=2, max_value=5))):
        raw: dict[str, Any] = {}
        for name, value in values.items():
            options = _spellings(name, value)
            if value == _DEFAULTS[name] and repr(value) == repr(_DEFAULTS[name]):
                options = [*options, _OMIT]
            choice = draw(st.sampled_from(options))
            if choice is not _OMIT:
                raw[name] = choice
        if draw(st.booleans()):
            raw["undeclared"] = draw(st.text(max_size=3))  # dropped (extra="ignore")
        order = draw(st.permutations(list(raw)))
        variants.append({key: raw[key] for key in order})
    return values, variants


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(equivalent_inputs())
def test_property_equivalent_raw_inputs_share_one_key_and_one_run(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    values, variants = case

    async def scenario() -> list[DispatchResult]:
        env = Env(prop)
        return [await env.call("prop", raw, call_id=f"c{i}") for i, raw in enumerate(variants)]

    runs.clear()
    results = run_sync(scenario())
    assert runs["prop"] == 1, variants
    assert [r.status for r in results] == ["ok"] + ["cache_hit"] * (len(variants) - 1)
    assert len({r.idempotency_key for r in results}) == 1
    material = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert results[0].idempotency_key == spec_key("prop", "p1", material)


_PATTERNS = (r"(?i)drop\s+table", r"secret")
_LIMIT = 8


@tool(idempotent=True, guard=InputGuard(blocked_patterns=(r"<script",)))
async def guarded(
    text: Annotated[str, Guard(max_length=_LIMIT, blocked_patterns=_PATTERNS)],
    notes: list[Annotated[str, Guard(max_length=_LIMIT)]] = [],  # noqa: B006
) -> str:
    runs["guarded"] += 1
    return text


def _breaks(value: str, patterns: tuple[str, ...]) -> bool:
    return any(re.search(p, value) for p in patterns) or len(value) > _LIMIT


_hostile_text = st.one_of(
    st.text(),
    st.text(max_size=4).map(lambda s: f"{s}secret"),
    st.text(max_size=3).map(lambda s: f"DROP \t TABLE{s}"),
    st.text(max_size=3).map(lambda s: f"<script{s}"),
    st.text(min_size=_LIMIT + 1, max_size=_LIMIT + 4),
)


_any_text = st.one_of(st.text(max_size=_LIMIT), _hostile_text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_any_text, notes=st.lists(_any_text, max_size=2))
def test_property_guardrail_rejections_never_touch_the_store(text: str, notes: list[str]) -> None:
    async def scenario() -> tuple[DispatchResult, Env]:
        env = Env(guarded)
        return await env.call("guarded", {"text": text, "notes": notes}), env

    runs.clear()
    result, env = run_sync(scenario())
    reject = _breaks(text, (*_PATTERNS, r"<script")) or any(
        _breaks(note, (r"<script",)) for note in notes
    )
    event("rejected" if reject else "accepted")
    if reject:
        assert result.status == "guardrail_violation", (text, notes)
        assert result.text is not None and result.text.startswith(GUARDRAIL)
        items = result.text.removeprefix(GUARDRAIL).split("; ")
        assert all(
            item.split(": ", 1)[1]
            in ("matches a blocked pattern", f"longer than {_LIMIT} characters")
            for item in items
        ), result.text
        assert env.store.calls == 0
        assert runs["guarded"] == 0
        assert env.statuses() == ["guardrail_violation"]
    else:
        assert result.status == "ok", (text, notes, result.text)
        assert runs["guarded"] == 1
        assert env.store.counts["claim"] == 1
