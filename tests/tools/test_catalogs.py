"""The tool catalog against the providers' published tool formats (guardrails spec §3.4, §3.5).

The OpenAI and Anthropic ``tools`` entry formats are encoded here as JSON Schemas. Each entry
of ``registry.openai_tools()`` / ``anthropic_tools()`` must match its provider's format, each
``parameters`` / ``input_schema`` must itself be a valid JSON Schema (Draft 2020-12), and the
arguments a model would send must validate against that schema and be accepted by
``Tool.validate``, while arguments the schema refuses are refused by ``Tool.validate`` too.
"""

import json
import re
from datetime import date, datetime
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from tooltrail.errors import ToolDefinitionError
from tooltrail.tools import ArgumentsRejected, Tool, ToolContext, ToolRegistry, tool
from tooltrail.tools.guards import Guard

jsonschema = pytest.importorskip(
    "jsonschema", reason="the jsonschema package is needed to check schemas against the meta-schema"
)
Draft202012Validator = jsonschema.Draft202012Validator

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"

# An object schema, as both providers require for the tool's parameters.
_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"const": "object"},
        "properties": {"type": "object", "additionalProperties": {"type": ["object", "boolean"]}},
        "required": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "additionalProperties": {"type": ["object", "boolean"]},
        "$defs": {"type": "object", "additionalProperties": {"type": ["object", "boolean"]}},
    },
}

OPENAI_TOOL_FORMAT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "description", "parameters"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": NAME_PATTERN},
                "description": {"type": "string"},
                "parameters": _OBJECT_SCHEMA,
                "strict": {"type": "boolean"},
            },
        },
    },
}

ANTHROPIC_TOOL_FORMAT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["name", "description", "input_schema"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string"},
        "input_schema": _OBJECT_SCHEMA,
    },
}


# -- a varied registry -------------------------------------------------------------------------


class Priority(StrEnum):
    LOW = "low"
    HIGH = "high"


class Level(IntEnum):
    DEBUG = 10
    INFO = 20


class Address(BaseModel):
    street: str
    city: Annotated[str, Field(description="City name")]
    zip: str | None = None


class Contact(BaseModel):
    """A contact as one model parameter (the model is the parameter schema)."""

    model_config = ConfigDict(frozen=True)

    name: Annotated[str, Field(description="Full name", min_length=1)]
    addresses: list[Address] = []
    priority: Priority = Priority.LOW
    birthday: date | None = None


@tool
async def search_docs(
    query: Annotated[str, Field(description="What to look for")],
    limit: int = 10,
    tags: list[str] | None = None,
    priority: Priority | None = None,
    since: datetime | None = None,
    exact: bool = False,
) -> list[str]:
    """Search the documentation.

    Args:
        limit: How many results to return.
        exact: Match the query exactly.
    """
    return [query]


@tool(extra="forbid")
def ship(
    address: Address,
    items: Annotated[list[Annotated[str, Guard(max_length=20)]], Field(min_length=1)],
    express: bool = False,
    unit: Literal["kg", "lb"] = "kg",
) -> str:
    """Ship items to an address."""
    return "shipped"


@tool
async def create_contact(contact: Contact) -> str:
    """Create a contact."""
    return contact.name


@tool(name="get-weather", description="Current weather for a city.")
async def weather(
    ctx: ToolContext,
    city: Annotated[str, Guard(max_length=40, blocked_patterns=(r"(?i)drop\s+table",))],
    days: Annotated[int, Field(ge=1, le=7, description="Forecast days")] = 1,
    level: Level = Level.INFO,
    ratios: dict[str, float] | None = None,
) -> str:
    return city


@tool
def ping() -> str:
    return "pong"


async def _remote(arguments: dict[str, Any], ctx: ToolContext) -> Any:
    return arguments


REMOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "Record id"},
        "fields": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id"],
}


def make_registry() -> ToolRegistry:
    reg = ToolRegistry([search_docs, ship, create_contact, weather, ping])
    reg.register_dynamic(
        "mcp_lookup", description="Remote lookup", parameters=REMOTE_SCHEMA, handler=_remote
    )
    return reg


# The arguments a model would send, per tool: accepted by the schema and by Tool.validate.
GOOD_ARGUMENTS: dict[str, list[dict[str, Any]]] = {
    "search_docs": [
        {"query": "retry policy"},
        {
            "query": "q",
            "limit": 3,
            "tags": ["a", "b"],
            "priority": "high",
            "since": "2026-01-02T03:04:05Z",
            "exact": True,
        },
        {"query": "q", "tags": None, "priority": None, "since": None},
    ],
    "ship": [
        {"address": {"street": "1 Main St", "city": "Oslo"}, "items": ["book"]},
        {
            "address": {"street": "2 Side St", "city": "Bergen", "zip": "5003"},
            "items": ["a" * 20, "b"],
            "express": True,
            "unit": "lb",
        },
    ],
    "create_contact": [
        {"name": "Ada"},
        {
            "name": "Grace",
            "addresses": [{"street": "x", "city": "y", "zip": None}],
            "priority": "high",
            "birthday": "1906-12-09",
        },
    ],
    "get-weather": [
        {"city": "Oslo"},
        {"city": "Oslo", "days": 7, "level": 10, "ratios": {"rain": 0.5}},
    ],
    "ping": [{}],
    "mcp_lookup": [{"id": "r1"}, {"id": "r2", "fields": ["a"]}],
}

# Arguments both the schema and Tool.validate refuse (static tools only: dynamic tools are
# never validated by the dispatcher).
BAD_ARGUMENTS: dict[str, list[dict[str, Any]]] = {
    "search_docs": [{}, {"query": "q", "priority": "urgent"}, {"query": "q", "tags": "a"}],
    "ship": [
        {"address": {"street": "1"}, "items": ["x"]},
        {"address": {"street": "1", "city": "c"}, "items": []},
        {"address": {"street": "1", "city": "c"}, "items": ["a" * 21]},
        {"address": {"street": "1", "city": "c"}, "items": ["x"], "unit": "stone"},
        {"address": {"street": "1", "city": "c"}, "items": ["x"], "surprise": 1},
    ],
    "create_contact": [{"name": ""}, {"name": "x", "priority": "urgent"}],
    "get-weather": [{"city": "x" * 41}, {"city": "Oslo", "days": 8}, {"city": "Oslo", "level": 5}],
}


def _static(reg: ToolRegistry, name: str) -> Tool:
    found = reg.lookup(name)
    assert found is not None
    return found


# -- the provider formats ----------------------------------------------------------------------


def test_the_format_schemas_are_valid_json_schemas() -> None:
    Draft202012Validator.check_schema(OPENAI_TOOL_FORMAT)
    Draft202012Validator.check_schema(ANTHROPIC_TOOL_FORMAT)


def test_openai_catalog_matches_the_openai_tool_format() -> None:
    catalog = make_registry().openai_tools()
    validator = Draft202012Validator(OPENAI_TOOL_FORMAT)
    for entry in catalog:
        errors = sorted(validator.iter_errors(entry), key=str)
        assert not errors, (entry["function"]["name"], [e.message for e in errors])
        # JSON Schema "pattern" is a search with Python's "$"; the name must match fully.
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", entry["function"]["name"])
    assert [e["function"]["name"] for e in catalog] == sorted(GOOD_ARGUMENTS)


def test_anthropic_catalog_matches_the_anthropic_tool_format() -> None:
    reg = make_registry()
    catalog = reg.anthropic_tools()
    validator = Draft202012Validator(ANTHROPIC_TOOL_FORMAT)
    for entry in catalog:
        errors = sorted(validator.iter_errors(entry), key=str)
        assert not errors, (entry["name"], [e.message for e in errors])
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", entry["name"])
    openai = reg.openai_tools()
    assert [e["name"] for e in catalog] == [e["function"]["name"] for e in openai]
    for a_entry, o_entry in zip(catalog, openai, strict=True):
        assert a_entry["input_schema"] == o_entry["function"]["parameters"]
        assert a_entry["description"] == o_entry["function"]["description"]


def test_catalogs_are_plain_json_and_stable() -> None:
    reg = make_registry()
    for catalog in (reg.openai_tools(), reg.anthropic_tools()):
        assert json.loads(json.dumps(catalog, allow_nan=False)) == catalog
    assert reg.openai_tools() == make_registry().openai_tools()
    # The catalog is a copy: changing it does not change the registry's next answer.
    first = reg.anthropic_tools()
    first[0]["input_schema"]["properties"]["injected"] = {"type": "string"}
    assert "injected" not in reg.anthropic_tools()[0]["input_schema"]["properties"]


@pytest.mark.parametrize("catalog", ["openai", "anthropic"])
def test_each_parameter_schema_is_a_valid_json_schema(catalog: str) -> None:
    reg = make_registry()
    if catalog == "openai":
        schemas = {e["function"]["name"]: e["function"]["parameters"] for e in reg.openai_tools()}
    else:
        schemas = {e["name"]: e["input_schema"] for e in reg.anthropic_tools()}
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object", name
        assert isinstance(schema.get("properties", {}), dict), name


# -- schema content (§3.4) ---------------------------------------------------------------------


def _parameters(name: str) -> dict[str, Any]:
    (entry,) = (e for e in make_registry().openai_tools() if e["function"]["name"] == name)
    params: dict[str, Any] = entry["function"]["parameters"]
    return params


def _generated_titles(schema: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                found.append(path or "/")
            elif key == "properties" and isinstance(value, dict):
                for prop, sub in value.items():
                    found.extend(_generated_titles(sub, f"{path}/properties/{prop}"))
            elif key not in ("default", "enum", "const", "examples"):
                found.extend(_generated_titles(value, f"{path}/{key}"))
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            found.extend(_generated_titles(item, f"{path}/{i}"))
    return found


def test_schema_content_required_defaults_descriptions_and_limits() -> None:
    search = _parameters("search_docs")
    assert search["required"] == ["query"]
    assert search["properties"]["query"]["description"] == "What to look for"
    assert search["properties"]["limit"] == {
        "default": 10,
        "description": "How many results to return.",
        "type": "integer",
    }
    assert search["properties"]["exact"]["description"] == "Match the query exactly."
    assert search["properties"]["priority"]["default"] is None
    assert "additionalProperties" not in search

    ship_params = _parameters("ship")
    assert ship_params["additionalProperties"] is False  # extra="forbid"
    assert sorted(ship_params["required"]) == ["address", "items"]
    assert ship_params["properties"]["items"]["items"]["maxLength"] == 20
    assert ship_params["properties"]["unit"]["enum"] == ["kg", "lb"]
    assert "Address" in ship_params["$defs"]

    contact = _parameters("create_contact")
    assert contact["required"] == ["name"]
    assert contact["properties"]["name"]["description"] == "Full name"

    weather_params = _parameters("get-weather")
    assert weather_params["properties"]["city"]["maxLength"] == 40
    assert "drop" not in json.dumps(weather_params).lower(), "blocked patterns stay secret"
    assert "ctx" not in weather_params["properties"], "ToolContext stays out of the schema"
    assert weather_params["properties"]["days"]["maximum"] == 7

    assert _parameters("ping") == {"type": "object", "properties": {}}
    assert _parameters("mcp_lookup") == REMOTE_SCHEMA, "a dynamic schema is returned as given"

    for name in GOOD_ARGUMENTS:
        if name != "mcp_lookup":
            assert _generated_titles(_parameters(name)) == [], name


def test_descriptions_come_from_the_docstring_or_the_decorator() -> None:
    descriptions = {e["name"]: e["description"] for e in make_registry().anthropic_tools()}
    assert descriptions == {
        "create_contact": "Create a contact.",
        "get-weather": "Current weather for a city.",
        "mcp_lookup": "Remote lookup",
        "ping": "",
        "search_docs": "Search the documentation.",
        "ship": "Ship items to an address.",
    }


# -- model arguments against the schema and Tool.validate --------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments"),
    [(name, args) for name, cases in GOOD_ARGUMENTS.items() for args in cases],
)
def test_model_arguments_validate_against_the_schema_and_the_tool(
    name: str, arguments: dict[str, Any]
) -> None:
    reg = make_registry()
    schema = _parameters(name)
    Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).validate(
        arguments
    )
    snapshot = _static(reg, name).validate(arguments)
    assert snapshot.ignored_arguments == ()
    if snapshot.canonical is not None:
        # What was accepted round-trips: the effective arguments satisfy the schema too.
        Draft202012Validator(schema).validate(json.loads(snapshot.canonical))


@pytest.mark.parametrize(
    ("name", "arguments"),
    [(name, args) for name, cases in BAD_ARGUMENTS.items() for args in cases],
)
def test_arguments_the_schema_refuses_are_refused_by_the_tool(
    name: str, arguments: dict[str, Any]
) -> None:
    reg = make_registry()
    assert not Draft202012Validator(_parameters(name)).is_valid(arguments)
    with pytest.raises(ArgumentsRejected) as info:
        _static(reg, name).validate(arguments)
    assert str(info.value).startswith("guardrail violation: ")


def test_dynamic_tools_accept_what_their_schema_refuses() -> None:
    # The remote side owns validation (§3.2): the schema is only advertised.
    reg = make_registry()
    arguments = {"fields": "not-a-list", "other": 1}
    assert not Draft202012Validator(_parameters("mcp_lookup")).is_valid(arguments)
    snapshot = _static(reg, "mcp_lookup").validate(arguments)
    assert snapshot.arguments == arguments


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_a_name_with_a_trailing_newline_is_refused(kind: str) -> None:
    def register() -> None:
        if kind == "static":
            tool(name="ping\n")(ping.fn)
        else:
            ToolRegistry().register_dynamic(
                "ping\n", description="", parameters={"type": "object"}, handler=_remote
            )

    with pytest.raises(ToolDefinitionError):
        register()


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "dot.name", "ünï", "slash/x"])
def test_names_outside_the_provider_pattern_are_refused(name: str) -> None:
    with pytest.raises(ToolDefinitionError):
        tool(name=name)(ping.fn)
    with pytest.raises(ToolDefinitionError):
        ToolRegistry().register_dynamic(
            name, description="", parameters={"type": "object"}, handler=_remote
        )


def test_the_longest_valid_name_is_accepted_by_both_formats() -> None:
    reg = ToolRegistry([tool(name="a" * 64)(ping.fn)])
    Draft202012Validator(OPENAI_TOOL_FORMAT).validate(reg.openai_tools()[0])
    Draft202012Validator(ANTHROPIC_TOOL_FORMAT).validate(reg.anthropic_tools()[0])
