"""Pure unit tests of tooltrail.tools: ``@tool``, schemas, validation, the registry, invocation."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import typing
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from tooltrail import (
    DuplicateToolError,
    Idempotency,
    RegistryFrozenError,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolOutput,
    ToolRegistry,
    ToolSpec,
    tool,
    tool_defaults,
)
from tooltrail.tools import ArgumentsRejected, to_output

# -- helpers ---------------------------------------------------------------------------------


def _keys(schema: Any) -> set[str]:
    """Every dict key anywhere in a schema, except the names inside ``properties``."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                for sub in value.values():
                    found |= _keys(sub)
            else:
                found.add(key)
                found |= _keys(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _keys(item)
    return found


def _ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(
        session_id="s1", turn_id="turn-1", tool_call_id="c1", attempt=0, temp_dir=tmp_path
    )


class Point(BaseModel):
    """A point."""

    x: int
    y: int = 0


class Item(BaseModel):
    name: str
    qty: int = 1


class Query(BaseModel):
    """Search parameters."""

    q: str = Field(description="What to look for")
    limit: int = 10


# -- @tool forms -----------------------------------------------------------------------------


def test_bare_decorator_builds_a_tool_named_after_the_function():
    @tool
    async def echo(ctx: ToolContext, text: str) -> str:
        """Echo the text back.

        Longer explanation that is not part of the description.
        """
        return text

    assert isinstance(echo, Tool)
    assert echo.name == "echo"
    assert echo.description == "Echo the text back."
    assert echo.is_async is True
    assert echo.context_param == "ctx"
    assert echo.concurrent_safe is False
    assert echo.resource_key is None
    assert echo.idempotent is False
    assert echo.guard is None
    assert echo.timeout_s is None
    assert echo.retry_on_interrupt is True
    assert repr(echo) == "Tool(name='echo')"


def test_idempotent_takes_a_bool_a_policy_or_none():
    declaration = bool | Idempotency | None
    assert typing.get_type_hints(tool)["idempotent"] == declaration
    assert typing.get_type_hints(Tool.__init__)["idempotent"] == declaration
    read_back = vars(Tool)["idempotent"]
    assert isinstance(read_back, property)
    assert typing.get_type_hints(read_back.fget)["return"] == bool | Idempotency

    @tool_defaults(idempotent=Idempotency(ttl_seconds=5))
    class Kit:
        @tool(idempotent=False)
        def own(self) -> str:
            """Declares its own."""
            return ""

    bound = Kit().own
    assert bound.idempotent is False
    bound.idempotent = None  # None declares nothing: the class's default decides again
    assert bound.idempotent == Idempotency(ttl_seconds=5)


def test_decorator_with_options():
    def key(args: dict[str, Any]) -> str | None:
        return str(args["path"])

    @tool(
        name="read",
        description="Read a file.",
        concurrent_safe=True,
        resource_key=key,
        idempotent=True,
        timeout_s=2.5,
        retry_on_interrupt=False,
    )
    def read_file(path: str, encoding: str = "utf-8") -> str:
        """Ignored docstring."""
        return path

    assert read_file.name == "read"
    assert read_file.description == "Read a file."
    assert read_file.is_async is False
    assert read_file.context_param is None
    assert read_file.idempotent is True
    assert read_file.timeout_s == 2.5
    assert read_file.retry_on_interrupt is False
    assert read_file.is_safe_for({"path": "/a"}) is True
    assert read_file.key_for({"path": "/a"}) == "/a"


def test_decorator_with_empty_parentheses_equals_bare():
    @tool()
    def ping() -> str:
        return "pong"

    assert ping.name == "ping"
    assert ping.description == ""


def test_concurrent_safe_may_depend_on_the_arguments():
    @tool(concurrent_safe=lambda args: args["mode"] == "read")
    def fs(mode: str) -> str:
        return mode

    assert fs.is_safe_for({"mode": "read"}) is True
    assert fs.is_safe_for({"mode": "write"}) is False
    assert fs.key_for({"mode": "read"}) is None


def test_tool_object_is_still_callable_directly():
    @tool
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    assert add(a=1, b=1) == 2


def test_sync_and_async_detection():
    @tool
    def sync_tool() -> str:
        return ""

    @tool
    async def async_tool() -> str:
        return ""

    assert sync_tool.is_async is False
    assert async_tool.is_async is True


# -- descriptions ----------------------------------------------------------------------------


def test_description_is_the_first_paragraph_collapsed_to_one_line():
    @tool
    def f() -> str:
        """Fetch a page
        from the web.

        Second paragraph.
        """
        return ""

    assert f.description == "Fetch a page from the web."


def test_description_without_docstring_is_empty():
    @tool
    def f() -> str:
        return ""

    assert f.description == ""


def test_description_when_docstring_starts_with_args_is_empty():
    @tool
    def f(a: int) -> str:
        """Args:
        a: the a.
        """
        return ""

    assert f.description == ""


def test_explicit_empty_description_is_kept():
    @tool(description="")
    def f() -> str:
        """Docstring."""
        return ""

    assert f.description == ""


# -- parameter schema (guardrails spec §3.4) -------------------------------------------------


def test_schema_from_type_hints_required_and_defaults():
    @tool
    def get_weather(
        city: Annotated[str, Field(description="City")], unit: str = "C", days: int = 1
    ) -> str:
        return city

    assert get_weather.parameters_schema() == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City"},
            "unit": {"type": "string", "default": "C"},
            "days": {"type": "integer", "default": 1},
        },
        "required": ["city"],
    }


def test_schema_has_no_generated_titles_anywhere():
    @tool
    def place(items: list[Item], at: Point | None = None, label: str = "x") -> str:
        return ""

    schema = place.parameters_schema()
    assert "title" not in _keys(schema)
    # $defs and $ref are kept.
    assert set(schema["$defs"]) == {"Item", "Point"}
    assert schema["properties"]["items"] == {"type": "array", "items": {"$ref": "#/$defs/Item"}}
    assert schema["$defs"]["Item"] == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "qty": {"type": "integer", "default": 1}},
        "required": ["name"],
    }


def test_schema_keeps_a_property_called_title():
    @tool
    def create_issue(title: str, body: str = "") -> str:
        return title

    schema = create_issue.parameters_schema()
    assert schema["properties"]["title"] == {"type": "string"}
    assert schema["required"] == ["title"]


def test_schema_keeps_title_keys_inside_default_values():
    @tool
    def greet(meta: dict[str, str] = {"title": "Mr"}) -> str:  # noqa: B006
        return ""

    prop = greet.parameters_schema()["properties"]["meta"]
    assert prop["default"] == {"title": "Mr"}


def test_schema_takes_descriptions_from_the_docstring_args_section():
    @tool
    def search(query: str, limit: int = 10, exact: bool = False) -> str:
        """Search the index.

        Args:
            query: The text to look for.
            limit (int): How many hits
                to return at most.
            exact: Match whole words only.

        Returns:
            The hits.
        """
        return ""

    props = search.parameters_schema()["properties"]
    assert props["query"] == {"type": "string", "description": "The text to look for."}
    assert props["limit"] == {
        "type": "integer",
        "default": 10,
        "description": "How many hits to return at most.",
    }
    assert props["exact"]["description"] == "Match whole words only."
    assert search.description == "Search the index."


def test_annotated_field_description_wins_over_the_docstring():
    @tool
    def lookup(key: Annotated[str, Field(description="From Field")], other: str = "") -> str:
        """Look up a key.

        Args:
            key: From docstring.
            other: Other from docstring.
        """
        return ""

    props = lookup.parameters_schema()["properties"]
    assert props["key"]["description"] == "From Field"
    assert props["other"]["description"] == "Other from docstring."


def test_field_constraints_appear_in_the_schema():
    @tool
    def post(
        text: Annotated[str, Field(max_length=5, min_length=1)],
        n: Annotated[int, Field(ge=0, le=9)] = 0,
    ) -> str:
        return text

    props = post.parameters_schema()["properties"]
    assert props["text"] == {"type": "string", "maxLength": 5, "minLength": 1}
    assert props["n"] == {"type": "integer", "default": 0, "minimum": 0, "maximum": 9}


def test_tool_context_stays_out_of_the_schema():
    @tool
    async def with_ctx(text: str, ctx: ToolContext) -> str:
        return text

    schema = with_ctx.parameters_schema()
    assert schema == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    assert with_ctx.context_param == "ctx"
    assert "ctx" not in with_ctx.params_model.model_fields


def test_schema_of_a_tool_without_parameters():
    @tool
    def now(ctx: ToolContext) -> str:
        return ""

    schema = now.parameters_schema()
    assert schema["type"] == "object"
    assert schema["properties"] == {}
    assert schema.get("required", []) == []
    assert "title" not in _keys(schema)


def test_generated_params_model_config():
    @tool
    def f(a: int) -> str:
        return ""

    config = f.params_model.model_config
    assert config.get("frozen") is True
    assert config.get("extra") == "ignore"
    assert config.get("allow_inf_nan") is False
    assert "additionalProperties" not in f.parameters_schema()


def test_spec_is_the_catalog_entry():
    @tool
    def f(a: int) -> str:
        """Do f."""
        return ""

    assert f.spec() == ToolSpec("f", "Do f.", f.parameters_schema(), "static")


# -- single BaseModel parameter form ---------------------------------------------------------


def test_single_model_parameter_uses_that_model():
    @tool
    def find(query: Query) -> str:
        return query.q

    assert find.params_model is Query
    # The model is used as is, so its own docstring stays the schema's description.
    assert find.parameters_schema() == {
        "type": "object",
        "description": "Search parameters.",
        "properties": {
            "q": {"type": "string", "description": "What to look for"},
            "limit": {"type": "integer", "default": 10},
        },
        "required": ["q"],
    }
    snapshot = find.validate({"q": "cats", "limit": "3"})
    assert isinstance(snapshot.model, Query)
    assert snapshot.model == Query(q="cats", limit=3)


def test_single_model_parameter_with_context_still_uses_the_model():
    @tool
    async def find(ctx: ToolContext, query: Query) -> str:
        return query.q

    assert find.params_model is Query
    assert find.context_param == "ctx"


def test_two_parameters_one_a_model_generate_a_wrapper():
    @tool
    def move(p: Point, label: str) -> str:
        return label

    assert move.params_model is not Point
    schema = move.parameters_schema()
    assert schema["required"] == ["p", "label"]
    assert schema["properties"]["p"] == {"$ref": "#/$defs/Point"}


# -- invalid definitions ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["has space", "dot.ted", "", "a" * 65, "ünï", "slash/y"])
def test_invalid_names_are_refused(name):
    def my_func() -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="my_func") as info:
        tool(name=name)(my_func)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["a", "a" * 64, "A-b_9", "read-file", "search_v2"])
def test_valid_names_are_accepted(name):
    def my_func() -> str:
        return ""

    assert tool(name=name)(my_func).name == name


def test_lambda_name_is_invalid():
    with pytest.raises(ToolDefinitionError, match="lambda"):
        tool(lambda: "x")


def test_var_positional_is_refused():
    def splat(*args: int) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="splat"):
        tool(splat)


def test_var_keyword_is_refused():
    def kw_splat(a: int, **kwargs: int) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="kw_splat"):
        tool(kw_splat)


def test_positional_only_is_refused():
    def pos_only(a: int, /, b: int) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="pos_only"):
        tool(pos_only)


def test_unannotated_parameter_is_refused():
    def untyped(a, b: int) -> str:  # type: ignore[no-untyped-def]
        return ""

    with pytest.raises(ToolDefinitionError, match="untyped") as info:
        tool(untyped)
    assert "'a'" in str(info.value)


def test_unresolvable_hint_is_refused():
    def broken(a: NoSuchType) -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    with pytest.raises(ToolDefinitionError, match="broken"):
        tool(broken)


# -- registry --------------------------------------------------------------------------------


def _noop_tool(name: str, doc: str = "") -> Tool:
    def body(value: str = "") -> str:
        return value

    body.__doc__ = doc or None
    return tool(name=name)(body)


def test_registry_lookup_and_names():
    reg = ToolRegistry([_noop_tool("tool_2"), _noop_tool("tool_10"), _noop_tool("Alpha")])
    assert reg.names() == ["Alpha", "tool_10", "tool_2"]
    assert [t.name for t in reg] == ["Alpha", "tool_10", "tool_2"]
    assert len(reg) == 3
    assert "tool_2" in reg
    assert "nope" not in reg
    found = reg.lookup("tool_2")
    assert isinstance(found, Tool)
    assert found.name == "tool_2"


def test_registry_lookup_miss_is_none_and_case_sensitive():
    reg = ToolRegistry([_noop_tool("echo")])
    assert reg.lookup("nope") is None
    assert reg.lookup("Echo") is None
    assert reg.lookup("echo ") is None


def test_register_returns_the_tool():
    reg = ToolRegistry()
    t = _noop_tool("a")
    assert reg.register(t) is t
    assert reg.names() == ["a"]


def test_duplicate_name_is_refused_at_registration():
    reg = ToolRegistry([_noop_tool("dup")])
    with pytest.raises(DuplicateToolError, match="dup") as info:
        reg.register(_noop_tool("dup"))
    assert isinstance(info.value, ValueError)
    assert reg.names() == ["dup"]


def test_duplicate_name_in_the_constructor_is_refused():
    with pytest.raises(DuplicateToolError, match="same"):
        ToolRegistry([_noop_tool("same"), _noop_tool("same")])


def test_frozen_registry_refuses_registration_but_still_looks_up():
    reg = ToolRegistry([_noop_tool("a")])
    reg.freeze()
    with pytest.raises(RegistryFrozenError, match="'b'"):
        reg.register(_noop_tool("b"))
    assert reg.names() == ["a"]
    assert reg.lookup("a") is not None


def test_register_refuses_a_plain_function():
    def plain(a: int) -> int:
        return a

    with pytest.raises(TypeError, match="@tool"):
        ToolRegistry().register(plain)  # type: ignore[arg-type]


def _catalog_registry() -> ToolRegistry:
    @tool
    def get_weather(city: Annotated[str, Field(description="City")], unit: str = "C") -> str:
        """Current weather for a city."""
        return city

    @tool
    async def add(a: int, b: int = 0) -> int:
        """Add two numbers."""
        return a + b

    return ToolRegistry([get_weather, add])


def test_tools_catalog_sorted_by_name():
    specs = _catalog_registry().tools()
    assert [s.name for s in specs] == ["add", "get_weather"]
    assert all(s.kind == "static" for s in specs)


def test_openai_tools_shape():
    tools = _catalog_registry().openai_tools()
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "integer"},
                        "b": {"type": "integer", "default": 0},
                    },
                    "required": ["a"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City"},
                        "unit": {"type": "string", "default": "C"},
                    },
                    "required": ["city"],
                },
            },
        },
    ]
    assert json.loads(json.dumps(tools)) == tools


def test_anthropic_tools_shape_matches_openai_parameters():
    reg = _catalog_registry()
    anthropic = reg.anthropic_tools()
    openai = reg.openai_tools()
    assert [t["name"] for t in anthropic] == ["add", "get_weather"]
    for a_entry, o_entry in zip(anthropic, openai, strict=True):
        assert set(a_entry) == {"name", "description", "input_schema"}
        assert a_entry["name"] == o_entry["function"]["name"]
        assert a_entry["description"] == o_entry["function"]["description"]
        assert a_entry["input_schema"] == o_entry["function"]["parameters"]
    assert json.loads(json.dumps(anthropic)) == anthropic


def test_json_schemas_by_name():
    reg = _catalog_registry()
    schemas = reg.json_schemas()
    assert list(schemas) == ["add", "get_weather"]
    assert schemas["add"] == reg.lookup("add").parameters_schema()  # type: ignore[union-attr]


def test_empty_registry_catalogs():
    reg = ToolRegistry()
    assert reg.names() == []
    assert reg.openai_tools() == []
    assert reg.anthropic_tools() == []
    assert reg.json_schemas() == {}


# -- validation (guardrails spec §4.2, §4.4) -------------------------------------------------


@tool
def typed(a: int, b: int, c: float = 1.0, tags: list[str] = Field(default_factory=list)) -> str:  # noqa: B008
    return ""


def test_validate_coerces_in_lax_mode():
    # validate returns a Snapshot (guardrails spec §4.3): the model plus its canonical bytes.
    snapshot = typed.validate({"a": "5", "b": 2}).model
    assert snapshot.a == 5  # type: ignore[attr-defined]
    assert snapshot.b == 2  # type: ignore[attr-defined]
    assert snapshot.c == 1.0  # type: ignore[attr-defined]
    assert snapshot.tags == []  # type: ignore[attr-defined]
    assert snapshot.model_dump() == {"a": 5, "b": 2, "c": 1.0, "tags": []}


def test_validate_drops_unknown_keys():
    result = typed.validate({"a": 1, "b": 2, "zz": "ignored"})
    snapshot = result.model
    assert snapshot.model_dump() == {"a": 1, "b": 2, "c": 1.0, "tags": []}
    assert not hasattr(snapshot, "zz")
    assert result.ignored_arguments == ("zz",)


def test_snapshot_is_frozen():
    snapshot = typed.validate({"a": 1, "b": 2}).model
    with pytest.raises(ValidationError):
        snapshot.a = 3  # type: ignore[attr-defined]


def test_rejection_lists_fields_in_declaration_order():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({"b": "y", "a": "x"})
    assert str(info.value) == "guardrail violation: a: not a valid integer; b: not a valid integer"


def test_rejection_for_a_missing_field():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({"b": 1})
    assert str(info.value) == "guardrail violation: a: field required"


def test_rejection_for_all_missing_fields():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({})
    assert str(info.value) == "guardrail violation: a: field required; b: field required"


def test_rejection_never_echoes_the_value():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({"a": "hunter2-secret", "b": 1, "tags": "s3cr3t-token"})
    text = str(info.value)
    assert text == "guardrail violation: a: not a valid integer; tags: not a valid list"
    assert "hunter2" not in text
    assert "s3cr3t" not in text


def test_fractional_float_is_not_an_integer():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({"a": 1.5, "b": 2})
    assert str(info.value) == "guardrail violation: a: not a valid integer"


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "nan", "-Infinity"])
def test_inf_and_nan_are_rejected(value):
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({"a": 1, "b": 2, "c": value})
    assert str(info.value) == "guardrail violation: c: not a finite number"


def test_non_numeric_float_is_rejected():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({"a": 1, "b": 2, "c": "lots"})
    assert str(info.value) == "guardrail violation: c: not a valid number"


def test_string_too_long_names_the_limit_not_the_value():
    @tool
    def post(text: Annotated[str, Field(max_length=5)], n: int = 0) -> str:
        return text

    with pytest.raises(ArgumentsRejected) as info:
        post.validate({"text": "toolong", "n": "abc"})
    assert str(info.value) == (
        "guardrail violation: text: longer than 5 characters; n: not a valid integer"
    )


def test_nested_errors_use_the_dotted_location():
    @tool
    def order(items: list[Item]) -> str:
        return ""

    with pytest.raises(ArgumentsRejected) as info:
        order.validate({"items": [{"name": "ok"}, {"name": 5, "qty": "many"}]})
    assert str(info.value) == (
        "guardrail violation: items.1.name: not a valid string; items.1.qty: not a valid integer"
    )


def test_arguments_rejected_chains_the_validation_error():
    with pytest.raises(ArgumentsRejected) as info:
        typed.validate({})
    assert isinstance(info.value.__cause__, ValidationError)


# -- to_output -------------------------------------------------------------------------------


def test_to_output_text():
    assert to_output("héllo") == ToolOutput(text="héllo")


def test_to_output_passes_tool_output_through():
    out = ToolOutput(text="x", is_error=True, display_hint="diff")
    assert to_output(out) is out


def test_to_output_pydantic_model_is_compact_json():
    assert to_output(Point(x=1, y=2)).text == '{"x":1,"y":2}'
    assert to_output(Item(name="Zürich")).text == '{"name":"Zürich","qty":1}'


def test_to_output_dict_is_compact_json_with_non_ascii_kept():
    out = to_output({"city": "Zürich", "temps": [1, 2.5], "ok": True, "none": None})
    assert out.text == '{"city":"Zürich","temps":[1,2.5],"ok":true,"none":null}'
    assert out.is_error is False
    assert out.parts is None


@pytest.mark.parametrize(
    ("value", "text"), [(42, "42"), (1.5, "1.5"), ([1, "a"], '[1,"a"]'), (None, "null")]
)
def test_to_output_json_values(value, text):
    assert to_output(value).text == text


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", {"when": Path("/tmp")}])
def test_to_output_refuses_non_serialisable_values(value):
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        to_output(value)


def test_to_output_refuses_circular_data():
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError, match="'list'"):
        to_output(loop)


# -- invoke ----------------------------------------------------------------------------------


async def test_invoke_passes_deep_copies(tmp_path):
    seen: list[Any] = []

    @tool
    def mutate(tags: list[str], nested: dict[str, list[int]]) -> str:
        tags.append("added")
        nested["k"].append(99)
        seen.append((tags, nested))
        return ",".join(tags)

    snapshot = mutate.validate({"tags": ["a"], "nested": {"k": [1]}})
    assert await mutate.invoke(_ctx(tmp_path), snapshot) == "a,added"
    assert snapshot.model.model_dump() == {"tags": ["a"], "nested": {"k": [1]}}
    assert snapshot.canonical == b'{"nested":{"k":[1]},"tags":["a"]}'
    # A second run sees the original values again.
    assert await mutate.invoke(_ctx(tmp_path), snapshot) == "a,added"
    assert seen[1] == (["a", "added"], {"k": [1, 99]})


async def test_invoke_model_parameter_gets_a_copy(tmp_path):
    received: list[Query] = []

    @tool
    def find(query: Query) -> str:
        received.append(query)
        return query.q

    snapshot = find.validate({"q": "cats"})
    assert await find.invoke(_ctx(tmp_path), snapshot) == "cats"
    assert received[0] == snapshot.model
    assert received[0] is not snapshot.model


async def test_invoke_runs_sync_bodies_in_a_worker_thread(tmp_path):
    loop_thread = threading.get_ident()

    @tool
    def where() -> int:
        return threading.get_ident()

    result = await where.invoke(_ctx(tmp_path), where.validate({}))
    assert result != loop_thread


async def test_invoke_runs_async_bodies_on_the_event_loop(tmp_path):
    loop_thread = threading.get_ident()

    @tool
    async def where() -> int:
        await asyncio.sleep(0)
        return threading.get_ident()

    assert await where.invoke(_ctx(tmp_path), where.validate({})) == loop_thread


async def test_invoke_injects_the_context(tmp_path):
    @tool
    async def whoami(ctx: ToolContext, suffix: str = "") -> str:
        return f"{ctx.session_id}/{ctx.tool_call_id}/{ctx.attempt}{suffix}"

    ctx = _ctx(tmp_path)
    assert await whoami.invoke(ctx, whoami.validate({"suffix": "!"})) == "s1/c1/0!"


async def test_invoke_propagates_body_exceptions(tmp_path):
    @tool
    def boom() -> str:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError, match=r"^x$"):
        await boom.invoke(_ctx(tmp_path), boom.validate({}))
