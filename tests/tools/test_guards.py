"""Unit tests of input guardrails, the catalog and dynamic tools (guardrails spec §3, §4).

Pure tests: ``Tool.validate`` is steps 3a-3d of dispatch, ``Tool.invoke`` is step 5; no
Temporal, no store. Numbers in test names refer to the spec's acceptance scenarios.
"""

from __future__ import annotations

import json
import re
import textwrap
import types
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, field_validator

from tests.support.clock import FakeClock
from tooltrail import DuplicateToolError, RegistryFrozenError, ToolDefinitionError
from tooltrail.tools import (
    ArgumentsRejected,
    DynamicTool,
    Snapshot,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    UnknownToolError,
    canonical_json,
    tool,
)
from tooltrail.tools.guards import (
    Guard,
    GuardrailViolation,
    InputGuard,
    ToolDefaults,
    readonly_view,
    tool_defaults,
)


def _ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(
        session_id="s1", turn_id="turn-1", tool_call_id="c1", attempt=0, temp_dir=tmp_path
    )


def _rejected(item: Tool, arguments: Any) -> ArgumentsRejected:
    with pytest.raises(ArgumentsRejected) as info:
        item.validate(arguments)
    return info.value


def _schema_text(item: Tool) -> str:
    return json.dumps(item.parameters_schema())


runs: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset_runs():
    runs.clear()


# -- §3.3 names, §7 unknown names ----------------------------------------------------------------


def test_unknown_tool_error_is_a_key_error_with_a_fixed_message():  # scenario 1
    reg = ToolRegistry()
    with pytest.raises(UnknownToolError) as info:
        reg.resolve("nope")
    err = info.value
    assert isinstance(err, KeyError)
    assert isinstance(err, LookupError)
    assert str(err) == "unknown tool: 'nope'"
    assert err.tool_name == "nope"
    with pytest.raises(UnknownToolError):
        reg["nope"]


def test_lookup_never_raises_and_runs_nothing():  # scenario 2
    @tool
    def t() -> str:
        runs["t"] += 1
        return ""

    reg = ToolRegistry([t])
    assert reg.lookup("nope") is None
    assert reg.lookup("t") is t
    assert reg.resolve("t") is t
    assert runs["t"] == 0


def test_dynamic_name_clashing_with_a_static_tool_is_refused():  # scenario 3
    @tool
    def x() -> str:
        return ""

    reg = ToolRegistry([x])
    with pytest.raises(DuplicateToolError, match="'x'"):
        reg.register_dynamic("x", description="", parameters={}, handler=_echo_handler)
    assert reg.lookup("x") is x


def test_static_name_clashing_with_a_dynamic_tool_is_refused():
    reg = ToolRegistry()
    reg.register_dynamic("y", description="", parameters={}, handler=_echo_handler)

    @tool
    def y() -> str:
        return ""

    with pytest.raises(DuplicateToolError, match="'y'"):
        reg.register(y)
    with pytest.raises(DuplicateToolError, match="'y'"):
        reg.register_dynamic("y", description="", parameters={}, handler=_echo_handler)


@pytest.mark.parametrize("name", ["has space", "dot.ted", "", "a" * 65, "ünï"])
def test_dynamic_names_follow_the_same_rule(name):
    with pytest.raises(ToolDefinitionError):
        ToolRegistry().register_dynamic(name, description="", parameters={}, handler=_echo_handler)


def test_frozen_registry_refuses_dynamic_tools():
    reg = ToolRegistry()
    reg.freeze()
    with pytest.raises(RegistryFrozenError, match="'d'"):
        reg.register_dynamic("d", description="", parameters={}, handler=_echo_handler)


# -- §3.4, §3.5 catalog ---------------------------------------------------------------------------


def test_catalog_formats_agree_and_are_sorted():  # scenario 4
    @tool
    def get_weather(city: Annotated[str, Field(description="City")], unit: str = "C") -> str:
        """Current weather."""
        return city

    @tool
    def add(a: int) -> int:
        return a

    reg = ToolRegistry([get_weather, add])
    reg.register_dynamic(
        "remote", description="R", parameters={"type": "object"}, handler=_echo_handler
    )
    openai = reg.openai_tools()
    assert [t["function"]["name"] for t in openai] == ["add", "get_weather", "remote"]
    params = openai[1]["function"]["parameters"]
    assert params["required"] == ["city"]
    assert params["properties"]["unit"]["default"] == "C"
    assert "title" not in json.dumps(params)
    anthropic = reg.anthropic_tools()
    assert [t["name"] for t in anthropic] == ["add", "get_weather", "remote"]
    for a_entry, o_entry in zip(anthropic, openai, strict=True):
        assert a_entry["input_schema"] == o_entry["function"]["parameters"]
    assert [s.kind for s in reg.tools()] == ["static", "static", "dynamic"]


def test_guard_max_length_is_in_the_schema_but_patterns_never_are():  # scenario 5
    @tool
    def g(text: Annotated[str, Guard(max_length=5, blocked_patterns=(r"secret",))]) -> str:
        return text

    assert g.parameters_schema() == {
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 5}},
        "required": ["text"],
    }
    assert "secret" not in _schema_text(g)


def test_guard_max_length_reaches_optional_and_nested_strings_in_the_schema():
    @tool
    def g(
        p: Annotated[str, Guard(max_length=3)] | None = None,
        tags: Annotated[list[str], Guard(max_length=2)] = [],  # noqa: B006
    ) -> str:
        return ""

    props = g.parameters_schema()["properties"]
    assert props["p"]["anyOf"] == [{"type": "string", "maxLength": 3}, {"type": "null"}]
    assert props["tags"]["items"] == {"type": "string", "maxLength": 2}
    assert "maxLength" not in props["tags"]


def test_input_guard_patterns_never_reach_the_schema():
    @tool(guard=InputGuard(blocked_patterns=(r"(?i)drop\s+table",)))
    def q(sql: str) -> str:
        return sql

    assert q.parameters_schema() == {
        "type": "object",
        "properties": {"sql": {"type": "string"}},
        "required": ["sql"],
    }


def test_additional_properties_only_with_extra_forbid():
    @tool(extra="forbid")
    def strict(a: int) -> str:
        return ""

    @tool
    def lax(a: int) -> str:
        return ""

    assert strict.parameters_schema()["additionalProperties"] is False
    assert strict.params_model.model_config.get("extra") == "forbid"
    assert "additionalProperties" not in lax.parameters_schema()


class Strict(BaseModel):
    model_config = {"extra": "forbid"}
    a: int


def test_model_parameter_that_forbids_extras_keeps_forbidding():
    @tool
    def f(args: Strict) -> str:
        return ""

    assert f.extra == "forbid"
    assert f.parameters_schema()["additionalProperties"] is False
    assert _rejected(f, {"a": 1, "b": 2}).text == "guardrail violation: b: unexpected argument"


# -- declaring guards ------------------------------------------------------------------------------


def test_invalid_blocked_pattern_fails_at_definition():
    with pytest.raises(ToolDefinitionError, match="not a valid regular expression"):
        Guard(blocked_patterns=("(unclosed",))
    with pytest.raises(ToolDefinitionError, match="not a valid regular expression"):
        InputGuard(blocked_patterns=("[",))


def test_invalid_pattern_in_an_annotation_fails_the_tool_definition():
    with pytest.raises(ToolDefinitionError):

        @tool
        def bad(text: Annotated[str, Guard(blocked_patterns=("*oops",))]) -> str:
            return text


@pytest.mark.parametrize("value", [-1, 1.5, "5", True])
def test_invalid_max_length_fails_at_definition(value):
    with pytest.raises(ToolDefinitionError, match="max_length"):
        Guard(max_length=value)


def test_a_lone_pattern_string_is_one_pattern():
    guard = Guard(blocked_patterns=r"ab")  # type: ignore[arg-type]
    assert guard.blocked_patterns == ("ab",)
    compiled = re.compile("xy", re.IGNORECASE)
    assert InputGuard(blocked_patterns=(compiled,)).blocked_patterns == (compiled,)


def test_guard_must_be_an_input_guard():
    def f(a: str) -> str:
        return a

    with pytest.raises(ToolDefinitionError, match="InputGuard"):
        tool(guard="nope")(f)  # type: ignore[call-overload]
    # A field-level Guard given at tool level is taken as its limits.
    t = tool(guard=Guard(max_length=1))(f)
    assert isinstance(t.guard, InputGuard)
    assert t.guard.max_length == 1


def test_extra_must_be_ignore_or_forbid():
    def f(a: str) -> str:
        return a

    with pytest.raises(ToolDefinitionError, match="extra"):
        tool(extra="allow")(f)  # type: ignore[call-overload]


# -- §4.2 3a: validate raw -------------------------------------------------------------------------


@tool
def g(text: Annotated[str, Guard(max_length=5, blocked_patterns=(r"secret",))]) -> str:
    runs["g"] += 1
    return text


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"text": "toolong"}, "guardrail violation: text: longer than 5 characters"),
        ({"text": "secret"}, "guardrail violation: text: matches a blocked pattern"),
        ({"text": "a secret!"}, "guardrail violation: text: matches a blocked pattern"),
    ],
)
def test_guarded_field_rejects_raw_values_without_echoing_them(arguments, text):  # scenario 6
    rejected = _rejected(g, arguments)
    assert str(rejected) == text
    assert rejected.text == text
    assert rejected.stage == "raw"
    assert arguments["text"] not in str(rejected)
    assert runs["g"] == 0


async def test_guarded_field_accepts_and_runs(tmp_path):
    snapshot = g.validate({"text": "fine"})
    assert await g.invoke(_ctx(tmp_path), snapshot) == "fine"
    assert runs["g"] == 1


def test_max_length_counts_code_points():
    @tool
    def t(s: Annotated[str, Guard(max_length=3)]) -> str:
        return s

    assert t.validate({"s": "日本語"}).model.s == "日本語"  # type: ignore[attr-defined]
    assert t.validate({"s": "👍🏽a"}).canonical == '{"s":"👍🏽a"}'.encode()
    assert _rejected(t, {"s": "日本語!"}).text == "guardrail violation: s: longer than 3 characters"


def test_limits_apply_to_every_nested_string_of_the_field():
    @tool
    def t(
        tags: Annotated[list[str], Guard(max_length=2)],
        meta: Annotated[dict[str, list[str]], Guard(blocked_patterns=("bad",))] = {},  # noqa: B006
    ) -> str:
        return ""

    assert _rejected(t, {"tags": ["ok", "long"], "meta": {"k": ["fine", "so bad"]}}).text == (
        "guardrail violation: tags.1: longer than 2 characters; meta.k.1: matches a blocked pattern"
    )


def test_guard_inside_an_optional_annotation_still_applies():
    @tool
    def t(p: Annotated[str, Guard(max_length=2)] | None = None) -> str:
        return ""

    assert _rejected(t, {"p": "abc"}).text == "guardrail violation: p: longer than 2 characters"
    assert t.validate({"p": None}).model.p is None  # type: ignore[attr-defined]


def test_raw_checks_run_before_coercion():
    @tool
    def t(n: Annotated[int, Guard(max_length=3)]) -> str:
        return ""

    # "12345" would coerce to a fine int, but the raw string is already too long.
    rejected = _rejected(t, {"n": "12345"})
    assert rejected.text == "guardrail violation: n: longer than 3 characters"
    assert rejected.stage == "raw"
    assert t.validate({"n": 12345}).model.n == 12345  # type: ignore[attr-defined]


Short = Annotated[str, Guard(max_length=2)]


def test_violations_follow_parameter_declaration_order():
    @tool
    def t(first: Short, second: Short, third: Short) -> str:
        return ""

    rejected = _rejected(t, {"third": "xxx", "first": "yyy", "second": "ok"})
    assert rejected.text == (
        "guardrail violation: first: longer than 2 characters; third: longer than 2 characters"
    )
    assert rejected.items == ("first: longer than 2 characters", "third: longer than 2 characters")


def test_tool_level_limits_apply_to_every_declared_argument_on_top_of_field_guards():
    @tool(guard=InputGuard(max_length=4, blocked_patterns=(r"(?i)drop\s+table",)))
    def t(a: str, b: Annotated[str, Guard(max_length=2)] = "", c: list[str] = []) -> str:  # noqa: B006
        return ""

    assert _rejected(t, {"a": "abcde"}).text == "guardrail violation: a: longer than 4 characters"
    assert _rejected(t, {"a": "x", "b": "abc"}).text == (
        "guardrail violation: b: longer than 2 characters"
    )
    assert _rejected(t, {"a": "x", "c": ["DROP  Table"]}).text == (
        "guardrail violation: c.0: matches a blocked pattern"
    )
    assert t.validate({"a": "abcd", "b": "ab", "c": ["ok"]}).model is not None


def test_arguments_must_be_an_object_with_string_keys():
    @tool
    def t(a: int = 0) -> str:
        return ""

    assert _rejected(t, ["a"]).text == "guardrail violation: (arguments): not a valid object"
    assert _rejected(t, "{}").text == "guardrail violation: (arguments): not a valid object"
    assert _rejected(t, {1: 2}).text == "guardrail violation: (arguments): keys must be strings"


def test_none_arguments_mean_empty():
    @tool
    def t(a: int = 7) -> str:
        return ""

    assert t.validate(None).canonical == b'{"a":7}'


def test_undeclared_keys_are_dropped_and_reported_with_extra_ignore():
    @tool
    def t(a: int) -> str:
        return ""

    snapshot = t.validate({"zz": 1, "a": 1, "yy": "x"})
    assert snapshot.ignored_arguments == ("zz", "yy")
    assert snapshot.canonical == b'{"a":1}'
    # Reported on rejections too, for the audit row.
    assert _rejected(t, {"a": "x", "zz": 1}).ignored_arguments == ("zz",)


def test_undeclared_keys_are_violations_with_extra_forbid():
    @tool(extra="forbid")
    def t(a: Annotated[str, Guard(max_length=1)]) -> str:
        return ""

    rejected = _rejected(t, {"zz": 1, "a": "long"})
    assert rejected.text == (
        "guardrail violation: a: longer than 1 characters; zz: unexpected argument"
    )
    assert rejected.stage == "raw"


def test_raw_validators_get_a_read_only_view_of_all_raw_arguments():
    seen: list[Any] = []

    def inspect_raw(raw: Any) -> None:
        seen.append(raw)
        with pytest.raises(TypeError):
            raw["a"] = "changed"
        with pytest.raises(AttributeError):
            raw["nested"]["list"].append(1)

    @tool(guard=InputGuard(raw_validators=(inspect_raw,)))
    def t(a: str, nested: dict[str, list[int]]) -> str:
        return ""

    original = {"a": "x", "nested": {"list": [1]}, "undeclared": True}
    t.validate(original)
    assert seen[0]["undeclared"] is True
    assert original == {"a": "x", "nested": {"list": [1]}, "undeclared": True}


def test_raw_validators_run_after_the_limits_and_before_materializing():
    calls: list[str] = []

    def raw_check(raw: Any) -> None:
        calls.append("raw")
        if raw.get("n") == "13":
            raise ValueError("unlucky")

    @tool(guard=InputGuard(max_length=3, raw_validators=(raw_check,)))
    def t(n: int) -> str:
        return ""

    assert _rejected(t, {"n": "1234"}).text == "guardrail violation: n: longer than 3 characters"
    assert calls == []
    rejected = _rejected(t, {"n": "13"})
    assert rejected.text == "guardrail violation: (arguments): unlucky"
    assert rejected.stage == "raw"
    assert calls == ["raw"]


# -- §4.2 3b: materialize once ---------------------------------------------------------------------


def test_coercion_failure_of_an_unguarded_tool_is_a_violation():  # scenario 8
    @tool
    def t(n: int) -> str:
        runs["t"] += 1
        return ""

    rejected = _rejected(t, {"n": "abc"})
    assert rejected.text == "guardrail violation: n: not a valid integer"
    assert rejected.stage == "materialize"
    assert runs["t"] == 0


class Params(BaseModel):
    code: str

    @field_validator("code")
    @classmethod
    def upper(cls, value: str) -> str:
        if not value.isupper():
            raise ValueError("must be upper case")
        return value


def test_pydantic_validators_reject_as_violations():
    @tool
    def t(params: Params) -> str:
        return ""

    assert _rejected(t, {"code": "abc"}).text == (
        "guardrail violation: code: value error, must be upper case"
    )


def test_default_factory_runs_once_per_validation():  # scenario 9
    clock = FakeClock(datetime(2024, 1, 1, tzinfo=UTC))

    @tool
    def t(when: datetime = Field(default_factory=clock)) -> str:  # noqa: B008
        return when.isoformat()

    snapshot = t.validate({})
    assert clock.calls == 1
    assert snapshot.canonical == b'{"when":"2024-01-01T00:00:00Z"}'
    assert snapshot.effective_arguments == '{"when":"2024-01-01T00:00:00Z"}'
    assert clock.calls == 1


def test_iso_string_coerces_to_datetime():
    @tool
    def t(when: datetime) -> str:
        return ""

    snapshot = t.validate({"when": "2024-05-01T10:00:00+00:00"})
    assert snapshot.model.when == datetime(2024, 5, 1, 10, tzinfo=UTC)  # type: ignore[attr-defined]


# -- §4.2 3c: validate effective -------------------------------------------------------------------


def test_default_that_breaks_a_limit_is_caught_after_materializing():  # scenario 7
    @tool
    def t(label: Annotated[str, Guard(max_length=5)] = "defaultlabel") -> str:
        runs["t"] += 1
        return label

    rejected = _rejected(t, {})
    assert rejected.text == "guardrail violation: label: longer than 5 characters"
    assert rejected.stage == "effective"
    assert runs["t"] == 0


class Shouting(BaseModel):
    word: str

    @field_validator("word")
    @classmethod
    def shout(cls, value: str) -> str:
        return value.upper() + "!!"


def test_coercion_that_breaks_a_limit_is_caught_after_materializing():
    @tool(guard=InputGuard(max_length=4, blocked_patterns=(r"DROP",)))
    def t(params: Shouting) -> str:
        return ""

    # The raw values pass 3a; what the model's own validator made of them does not.
    rejected = _rejected(t, {"word": "drop"})
    assert rejected.text == "guardrail violation: word: matches a blocked pattern"
    assert rejected.stage == "effective"
    assert (
        _rejected(t, {"word": "abc"}).text == "guardrail violation: word: longer than 4 characters"
    )
    assert t.validate({"word": "ab"}).canonical == b'{"word":"AB!!"}'


class Item(BaseModel):
    name: Annotated[str, Guard(max_length=3)]


def test_nested_model_guards_are_enforced_after_materializing():
    @tool
    def order(items: list[Item]) -> str:
        return ""

    rejected = _rejected(order, {"items": [{"name": "abc"}, {"name": "abcd"}]})
    assert rejected.text == "guardrail violation: items.1.name: longer than 3 characters"
    assert rejected.stage == "effective"


def test_validators_get_a_copy_of_the_model_and_may_name_a_field():
    seen: list[BaseModel] = []

    def weekday(model: Any) -> None:
        seen.append(model)
        if model.day in {"sat", "sun"}:
            raise GuardrailViolation("day", "must be a weekday")

    def whole(model: Any) -> None:
        if model.day == "mon" and model.note:
            raise ValueError("no notes on mondays")

    @tool(guard=InputGuard(validators=(weekday, whole)))
    def book(day: str, note: str = "") -> str:
        return day

    assert _rejected(book, {"day": "sat"}).text == "guardrail violation: day: must be a weekday"
    assert _rejected(book, {"day": "mon", "note": "x"}).text == (
        "guardrail violation: (arguments): no notes on mondays"
    )
    snapshot = book.validate({"day": "tue"})
    assert seen[-1] == snapshot.model
    assert seen[-1] is not snapshot.model


def test_guardrail_violation_accepts_a_path():
    err = GuardrailViolation(("items", 0, "name"), "taken")
    assert err.field == "items.0.name"
    assert err.item == "items.0.name: taken"
    assert isinstance(err, ValueError)
    assert GuardrailViolation(None, "bad").item == "(arguments): bad"


def test_a_crashing_validator_rejects_without_leaking_details(caplog):
    def buggy(model: Any) -> None:
        raise KeyError("internal secret")

    @tool(guard=InputGuard(validators=(buggy,)))
    def t(a: str) -> str:
        return ""

    rejected = _rejected(t, {"a": "x"})
    assert rejected.text == "guardrail violation: (arguments): guard validator failed (KeyError)"
    assert "secret" not in rejected.text


# -- §4.3 the effective snapshot -------------------------------------------------------------------


def test_snapshot_holds_the_model_and_its_canonical_bytes():
    @tool
    def t(b: str, a: int = 1, text: str = "") -> str:
        return ""

    snapshot = t.validate({"b": "Zürich", "text": "x"})
    assert isinstance(snapshot, Snapshot)
    assert snapshot.kind == "static"
    assert snapshot.model is not None
    assert snapshot.canonical == canonical_json(snapshot.model.model_dump(mode="json"))
    assert snapshot.canonical == '{"a":1,"b":"Zürich","text":"x"}'.encode()
    assert snapshot.arguments is None


def test_explicit_none_and_absent_key_give_two_snapshots_with_a_non_none_default():  # 10
    @tool
    def t(p: str | None = "x") -> str:
        return ""

    assert t.validate({"p": None}).canonical == b'{"p":null}'
    assert t.validate({}).canonical == b'{"p":"x"}'


def test_explicit_none_and_absent_key_agree_with_a_none_default():
    @tool
    def t(p: str | None = None) -> str:
        return ""

    assert t.validate({"p": None}).canonical == t.validate({}).canonical == b'{"p":null}'


def test_none_is_never_checked_against_limits():
    @tool(guard=InputGuard(max_length=0, blocked_patterns=(".",)))
    def t(p: str | None = None, items: list[str | None] = []) -> str:  # noqa: B006
        return ""

    assert t.validate({"p": None, "items": [None, None]}).canonical == (
        b'{"items":[null,null],"p":null}'
    )


async def test_body_mutations_never_reach_the_snapshot(tmp_path):  # scenario 11
    @tool
    def t(tags: list[str]) -> str:
        tags.append("added")
        runs["t"] += 1
        return ",".join(tags)

    snapshot = t.validate({"tags": ["a"]})
    assert await t.invoke(_ctx(tmp_path), snapshot) == "a,added"
    assert await t.invoke(_ctx(tmp_path), snapshot) == "a,added"
    assert snapshot.canonical == b'{"tags":["a"]}'
    assert snapshot.model.model_dump() == {"tags": ["a"]}


def test_validate_never_aliases_the_callers_data():
    @tool
    def t(meta: dict[str, Any]) -> str:
        return ""

    raw = {"meta": {"k": [1]}}
    snapshot = t.validate(raw)
    raw["meta"]["k"].append(2)
    assert snapshot.canonical == b'{"meta":{"k":[1]}}'


def test_equivalent_arguments_give_the_same_snapshot_bytes():  # scenarios 12 and 13
    @tool
    def f(unit: str = "C", n: int = 0) -> str:
        return ""

    variants: list[dict[str, Any]] = [{}, {"unit": "C"}, {"n": "0"}, {"n": 0, "unit": "C"}]
    assert {f.validate(v).canonical for v in variants} == {b'{"n":0,"unit":"C"}'}

    @tool
    def h(a: int, b: int) -> str:
        return ""

    keys = {h.validate(v).canonical for v in ({"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 2, "b": 2})}
    assert len(keys) == 2


# -- defaults: method > class > module ------------------------------------------------------------


def test_tool_without_declarations_has_no_guard_and_is_not_idempotent():
    @tool
    def t() -> str:
        return ""

    assert t.guard is None
    assert t.idempotent is False


@tool_defaults(guard=InputGuard(max_length=2), idempotent=True)
class Kit:
    """A toolkit: tools are methods; its defaults apply unless a method declares its own."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    @tool
    def a(self, s: str) -> str:
        """Tool a."""
        runs["a"] += 1
        return self.prefix + s

    @tool(idempotent=False, guard=InputGuard(max_length=5))
    async def b(self, s: str, ctx: ToolContext) -> str:
        runs["b"] += 1
        return f"{self.prefix}{s}/{ctx.tool_call_id}"


def test_class_defaults_apply_to_methods_without_their_own():  # scenario 17 (declarations)
    kit = Kit()
    assert kit.a.idempotent is True
    assert kit.a.guard == InputGuard(max_length=2)
    assert kit.b.idempotent is False
    # The nearest guard replaces the class's: b allows 5 characters, not 2.
    assert kit.b.guard == InputGuard(max_length=5)
    assert _rejected(kit.a, {"s": "abc"}).text == "guardrail violation: s: longer than 2 characters"
    assert kit.b.validate({"s": "abcde"}).canonical == b'{"s":"abcde"}'


async def test_method_tools_bind_to_their_instance(tmp_path):
    kit = Kit(prefix=">")
    assert isinstance(kit.a, Tool)
    assert kit.a is kit.a
    assert kit.a.name == "a"
    assert kit.a.description == "Tool a."
    assert kit.a.parameters_schema() == {
        "type": "object",
        "properties": {"s": {"type": "string"}},
        "required": ["s"],
    }
    assert await kit.a.invoke(_ctx(tmp_path), kit.a.validate({"s": "x"})) == ">x"
    assert await kit.b.invoke(_ctx(tmp_path), kit.b.validate({"s": "y"})) == ">y/c1"
    assert kit.a("z") == ">z"
    assert Kit().a is not kit.a


def test_register_toolkit_and_bound_methods():
    kit = Kit()
    reg = ToolRegistry()
    assert [t.name for t in reg.register_toolkit(kit)] == ["a", "b"]
    assert reg.lookup("a") is kit.a
    other = ToolRegistry([Kit().a])
    assert other.names() == ["a"]


def test_a_method_tool_read_from_the_class_cannot_be_registered():
    with pytest.raises(TypeError, match="instance"):
        ToolRegistry().register(Kit.a)


def test_class_defaults_are_inherited_and_overridable():
    class Sub(Kit):
        pass

    @tool_defaults(idempotent=False)
    class Override(Kit):
        pass

    assert Sub().a.idempotent is True
    assert Override().a.idempotent is False
    # The nearer class declares no guard, so the next level's guard applies.
    assert Override().a.guard == InputGuard(max_length=2)


def test_tool_defaults_decorates_classes_only():
    with pytest.raises(TypeError):
        tool_defaults(idempotent=True)(lambda: None)  # type: ignore[type-var]


def _module(source: str, name: str = "tt_defaults_mod") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(textwrap.dedent(source), vars(module))
    return module


_MODULE_SOURCE = """
    from typing import Annotated
    from tooltrail.tools.guards import Guard, InputGuard, ToolDefaults, tool_defaults
    from tooltrail.tools import tool

    @tool
    def plain(s: str) -> str:
        return s

    @tool(idempotent=False, guard=InputGuard(max_length=10))
    def own(s: str) -> str:
        return s

    @tool_defaults(guard=InputGuard(max_length=3))
    class Kit:
        @tool
        def method(self, s: str) -> str:
            return s

    # Defined after the tools on purpose: defaults are read when needed, not at decoration.
    TOOLTRAIL_DEFAULTS = ToolDefaults(guard=InputGuard(max_length=1), idempotent=True)
"""


def test_module_defaults_apply_to_tools_without_their_own():  # scenario 18 (declarations)
    mod = _module(_MODULE_SOURCE)
    assert mod.plain.idempotent is True
    assert mod.plain.guard == InputGuard(max_length=1)
    assert mod.own.idempotent is False
    assert mod.own.guard == InputGuard(max_length=10)
    kit = mod.Kit()
    # method > class > module, the nearest replaces.
    assert kit.method.guard == InputGuard(max_length=3)
    assert kit.method.idempotent is True
    assert _rejected(mod.plain, {"s": "ab"}).text == (
        "guardrail violation: s: longer than 1 characters"
    )


def test_register_module_adds_its_tools():
    mod = _module(_MODULE_SOURCE)
    reg = ToolRegistry()
    added = reg.register_module(mod)
    assert [t.name for t in added] == ["plain", "own"]
    assert reg.names() == ["own", "plain"]


def test_register_module_is_all_or_nothing():
    mod = _module(_MODULE_SOURCE)

    @tool
    def own() -> str:
        return ""

    reg = ToolRegistry([own])
    with pytest.raises(DuplicateToolError, match="'own'"):
        reg.register_module(mod)
    assert reg.names() == ["own"]


def test_module_defaults_must_be_tool_defaults():
    mod = _module(
        """
        from tooltrail.tools import tool

        TOOLTRAIL_DEFAULTS = {"idempotent": True}

        @tool
        def t() -> str:
            return ""
        """,
        name="tt_bad_defaults",
    )
    with pytest.raises(ToolDefinitionError, match="TOOLTRAIL_DEFAULTS"):
        ToolRegistry().register(mod.t)


def test_tool_defaults_accepts_only_input_guards():
    with pytest.raises(ToolDefinitionError):
        ToolDefaults(guard="x")  # type: ignore[arg-type]


# -- §3.2 dynamic tools ----------------------------------------------------------------------------


async def _echo_handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
    runs["dyn"] += 1
    seen_by_handler.append(json.loads(json.dumps(arguments)))
    arguments["mutated"] = True
    return {"got": arguments, "call": ctx.tool_call_id}


seen_by_handler: list[Any] = []

_DYN_SCHEMA = {
    "type": "object",
    "properties": {"x": {"type": "string", "maxLength": 3, "title": "X"}},
    "required": ["x"],
    "additionalProperties": False,
}


async def test_dynamic_tool_passes_raw_arguments_through_unvalidated(tmp_path):  # scenario 30
    seen_by_handler.clear()
    reg = ToolRegistry()
    dyn = reg.register_dynamic(
        "remote", description="A remote tool.", parameters=_DYN_SCHEMA, handler=_echo_handler
    )
    raw = {"x": "way too long", "extra": 1}
    for _ in range(2):
        snapshot = dyn.validate(raw)
        assert snapshot.kind == "dynamic"
        assert snapshot.model.model_dump() == raw
        assert snapshot.canonical is None
        assert snapshot.effective_arguments is None
        assert snapshot.ignored_arguments == ()
        result = await dyn.invoke(_ctx(tmp_path), snapshot)
        assert result["call"] == "c1"
        # The handler's mutation stays in its own copy.
        assert snapshot.arguments == raw
    assert seen_by_handler == [raw, raw]
    assert raw == {"x": "way too long", "extra": 1}
    assert runs["dyn"] == 2


def test_dynamic_tool_offers_the_static_interface():
    reg = ToolRegistry()
    dyn = reg.register_dynamic(
        "remote", description="A remote tool.", parameters=_DYN_SCHEMA, handler=_echo_handler
    )
    assert isinstance(dyn, DynamicTool)
    assert isinstance(dyn, Tool)
    assert reg.lookup("remote") is dyn
    assert dyn.kind == "dynamic"
    assert dyn.name == "remote"
    assert dyn.description == "A remote tool."
    assert dyn.timeout_s is None
    assert dyn.retry_on_interrupt is True
    assert dyn.concurrent_safe is False
    assert dyn.resource_key is None
    assert dyn.idempotent is False
    assert dyn.guard is None
    assert dyn.is_safe_for({"x": "a"}) is False
    assert dyn.key_for({"x": "a"}) is None
    # The schema comes back exactly as registered, titles and all.
    assert dyn.parameters_schema() == _DYN_SCHEMA
    assert dyn.spec() == ToolSpec("remote", "A remote tool.", _DYN_SCHEMA, "dynamic")
    assert reg.anthropic_tools() == [
        {"name": "remote", "description": "A remote tool.", "input_schema": _DYN_SCHEMA}
    ]
    assert dyn.validate(None).arguments == {}


def test_dynamic_schema_is_copied_at_registration():
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    dyn = ToolRegistry().register_dynamic(
        "remote", description="", parameters=schema, handler=_echo_handler
    )
    schema["properties"]["sneaky"] = {"type": "string"}
    dyn.parameters_schema()["properties"]["other"] = {}
    assert dyn.parameters_schema() == {"type": "object", "properties": {}}


@pytest.mark.parametrize("extra", [{"idempotent": True}, {"guard": InputGuard()}])
def test_dynamic_tools_accept_no_idempotency_or_guard(extra):  # scenario 31
    reg = ToolRegistry()
    with pytest.raises(TypeError, match=next(iter(extra))):
        reg.register_dynamic(
            "remote", description="", parameters={}, handler=_echo_handler, **extra
        )
    assert "remote" not in reg


def test_dynamic_tool_definition_errors():
    reg = ToolRegistry()
    with pytest.raises(TypeError, match="callable"):
        reg.register_dynamic("r", description="", parameters={}, handler="nope")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="JSON"):
        reg.register_dynamic("r", description="", parameters={"x": object()}, handler=_echo_handler)
    with pytest.raises(ToolDefinitionError):
        reg.register_dynamic("r", description="", parameters=[], handler=_echo_handler)  # type: ignore[arg-type]


async def test_sync_dynamic_handler_runs_in_a_thread(tmp_path):
    def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return sorted(arguments)

    dyn = ToolRegistry().register_dynamic(
        "sync_remote",
        description="",
        parameters={},
        handler=handler,
    )
    assert await dyn.invoke(_ctx(tmp_path), dyn.validate({"b": 1, "a": 2})) == ["a", "b"]


# -- helpers ---------------------------------------------------------------------------------------


def test_readonly_view_is_deep_and_detached():
    data: dict[str, Any] = {"a": [1, {"b": {"c"}}], "d": "x"}
    view = readonly_view(data)
    assert view["a"][1]["b"] == frozenset({"c"})
    with pytest.raises(TypeError):
        view["d"] = "y"
    with pytest.raises(TypeError):
        view["a"][1]["b2"] = 1
    data["a"].append(2)
    assert len(view["a"]) == 2


def test_canonical_json_is_compact_sorted_and_utf8():
    assert canonical_json({"b": 1, "a": "é", "c": [1.5, None]}) == (
        '{"a":"é","b":1,"c":[1.5,null]}'.encode()
    )
    with pytest.raises(ValueError, match="JSON compliant"):
        canonical_json({"x": float("nan")})
