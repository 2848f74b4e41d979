"""Defining tools: ``@tool``, ``ToolContext`` and ``ToolRegistry``.

A tool's parameters become a generated pydantic model (frozen, extra keys ignored, no
inf/NaN), so the JSON schema, the validation and the coercion of arguments all come from the
function's type hints. This module runs worker-side and client-side, never in workflow code.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from tooltrail.errors import DuplicateToolError, RegistryFrozenError, ToolDefinitionError
from tooltrail.results import ToolOutput

__all__ = ["Tool", "ToolContext", "ToolRegistry", "ToolSpec", "tool"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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


@dataclass(frozen=True)
class ToolSpec:
    """One catalog entry."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: str = "static"


# Keywords whose values are data (JSON values of the tool's arguments), never sub-schemas:
# a default like {"title": "Mr"} must reach the model unchanged.
_SCHEMA_VALUE_KEYWORDS = frozenset({"default", "const", "enum", "examples", "example"})


def _strip_titles(schema: Any) -> Any:
    # pydantic adds "title" to every object and property; providers do not need them and the
    # model reads every token, so drop the generated ones (a property named "title" stays).
    if isinstance(schema, dict):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            elif key == "title" and isinstance(value, str):
                continue
            elif key in _SCHEMA_VALUE_KEYWORDS:
                out[key] = value
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Return the first paragraph of a docstring and the Google-style ``Args:`` entries."""
    if not doc:
        return "", {}
    text = inspect.cleandoc(doc)
    first = text.split("\n\n", 1)[0].strip()
    if first.startswith(("Args:", "Arguments:")):
        first = ""
    args: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments):\s*\n((?:[ \t]+.*\n?|\n)*)", text, re.MULTILINE)
    if match:
        current: str | None = None
        for line in match.group(1).splitlines():
            entry = re.match(r"^\s{2,}(\*{0,2}\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
            if entry and (current is None or not line.startswith(" " * 8)):
                current = entry.group(1).lstrip("*")
                args[current] = entry.group(2).strip()
            elif current and line.strip():
                args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(first.split()), args


_REASONS = {
    "missing": "field required",
    "int_parsing": "not a valid integer",
    "int_type": "not a valid integer",
    "int_from_float": "not a valid integer",
    "float_parsing": "not a valid number",
    "float_type": "not a valid number",
    "finite_number": "not a finite number",
    "bool_parsing": "not a valid boolean",
    "bool_type": "not a valid boolean",
    "string_type": "not a valid string",
    "dict_type": "not a valid object",
    "model_type": "not a valid object",
    "list_type": "not a valid list",
}


def guardrail_text(error: ValidationError) -> str:
    """Render a validation error as the soft ``guardrail violation: ...`` text.

    Offending values are never echoed: the text names fields and reasons only.
    """
    items: list[str] = []
    for err in error.errors(include_input=False, include_url=False):
        location = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        ctx = err.get("ctx") or {}
        kind = err["type"]
        if kind == "string_too_long":
            reason = f"longer than {ctx.get('max_length')} characters"
        elif kind == "string_too_short":
            reason = f"shorter than {ctx.get('min_length')} characters"
        else:
            reason = _REASONS.get(kind) or str(err["msg"]).lower()
        items.append(f"{location}: {reason}")
    return "guardrail violation: " + "; ".join(items)


class ArgumentsRejected(Exception):
    """Raised by ``Tool.invoke`` when the arguments fail validation; carries the soft text."""


class Tool:
    """A registered tool: a function plus its parameter model and dispatch declarations."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
        resource_key: Callable[[dict[str, Any]], str | None] | None = None,
        idempotent: Any = False,
        guard: Any = None,
        timeout_s: float | None = None,
        retry_on_interrupt: bool = True,
    ) -> None:
        """Build a tool from a function; prefer the ``@tool`` decorator.

        Raises:
            ToolDefinitionError: the name is invalid, or a parameter is ``*args``,
                ``**kwargs``, positional-only or unannotated.
        """
        self.fn = fn
        self.name = fn.__name__ if name is None else name
        if not _NAME.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} of {fn.__qualname__!r} is invalid: "
                "use 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
            )
        summary, arg_docs = _docstring_parts(fn.__doc__)
        self.description = summary if description is None else description
        self.concurrent_safe = concurrent_safe
        self.resource_key = resource_key
        self.idempotent = idempotent
        self.guard = guard
        self.timeout_s = timeout_s
        self.retry_on_interrupt = retry_on_interrupt
        self.is_async = inspect.iscoroutinefunction(fn)
        self.context_param: str | None = None
        self._model_param: str | None = None
        self.params_model = self._build_model(arg_docs)

    def _build_model(self, arg_docs: dict[str, str]) -> type[BaseModel]:
        fn = self.fn
        try:
            hints = get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise ToolDefinitionError(
                f"cannot resolve the type hints of tool function {fn.__qualname__!r}: {exc}"
            ) from exc
        fields: dict[str, Any] = {}
        params = list(inspect.signature(fn).parameters.values())
        for param in params:
            where = f"parameter {param.name!r} of tool function {fn.__qualname__!r}"
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(f"{where}: *args and **kwargs are not supported")
            if param.kind is param.POSITIONAL_ONLY:
                raise ToolDefinitionError(f"{where}: positional-only parameters are not supported")
            if param.name not in hints:
                raise ToolDefinitionError(f"{where} needs a type annotation")
            annotation = hints[param.name]
            if annotation is ToolContext:
                self.context_param = param.name
                continue
            default = ... if param.default is param.empty else param.default
            if arg_docs.get(param.name) and not isinstance(default, FieldInfo):
                info = FieldInfo.from_annotated_attribute(annotation, default)
                # An Annotated Field(description=...) wins over the docstring's Args entry.
                if info.description is None:
                    default = FieldInfo.merge_field_infos(info, description=arg_docs[param.name])
            fields[param.name] = (annotation, default)
        if len(fields) == 1:
            (only, (annotation, _default)) = next(iter(fields.items()))
            if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
                self._model_param = only
                return annotation
        model_name = "".join(part.capitalize() for part in re.split(r"[_-]", self.name)) or "Tool"
        return create_model(
            f"{model_name}Arguments",
            __config__=ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False),
            **fields,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r})"

    def parameters_schema(self) -> dict[str, Any]:
        """Return the JSON schema of the parameters (validation mode, no generated titles)."""
        schema: dict[str, Any] = _strip_titles(self.params_model.model_json_schema())
        schema.setdefault("properties", {})
        schema.setdefault("type", "object")
        return schema

    def spec(self) -> ToolSpec:
        """Return the tool's catalog entry."""
        return ToolSpec(self.name, self.description, self.parameters_schema())

    def is_safe_for(self, arguments: dict[str, Any]) -> bool:
        """Return whether this call may run concurrently with others."""
        if callable(self.concurrent_safe):
            return bool(self.concurrent_safe(arguments))
        return bool(self.concurrent_safe)

    def key_for(self, arguments: dict[str, Any]) -> str | None:
        """Return the resource key of a concurrent-safe call, or ``None``."""
        return None if self.resource_key is None else self.resource_key(arguments)

    def validate(self, arguments: Mapping[str, Any]) -> BaseModel:
        """Validate and materialise the arguments once.

        Raises:
            ArgumentsRejected: with the soft ``guardrail violation: ...`` text.
        """
        try:
            return self.params_model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ArgumentsRejected(guardrail_text(exc)) from exc

    async def invoke(self, ctx: ToolContext, snapshot: BaseModel) -> Any:
        """Run the body on a deep copy of the validated arguments; sync bodies run in a thread.

        Exceptions from the body propagate; the caller isolates them.
        """
        if self._model_param is not None:
            kwargs: dict[str, Any] = {self._model_param: snapshot.model_copy(deep=True)}
        else:
            kwargs = {
                name: copy.deepcopy(getattr(snapshot, name)) for name in type(snapshot).model_fields
            }
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        if self.is_async:
            return await self.fn(**kwargs)
        return await asyncio.to_thread(self.fn, **kwargs)


def to_output(value: Any) -> ToolOutput:
    """Turn what a tool returned into a ``ToolOutput``.

    Raises:
        TypeError: the value is not text, a ``ToolOutput``, a pydantic model or JSON data.
    """
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(text=value)
    if isinstance(value, BaseModel):
        return ToolOutput(text=value.model_dump_json())
    try:
        return ToolOutput(text=json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"returned a value of type {type(value).__name__!r}, which is not JSON-serialisable"
        ) from exc


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
    resource_key: Callable[[dict[str, Any]], str | None] | None = None,
    idempotent: Any = False,
    guard: Any = None,
    timeout_s: float | None = None,
    retry_on_interrupt: bool = True,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
    resource_key: Callable[[dict[str, Any]], str | None] | None = None,
    idempotent: Any = False,
    guard: Any = None,
    timeout_s: float | None = None,
    retry_on_interrupt: bool = True,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: ``@tool`` or ``@tool(name=..., ...)`` on a ``def`` or ``async def``.

    Args:
        fn: the function, when used bare.
        name: the tool name (default: the function name).
        description: the description (default: the docstring's first paragraph).
        concurrent_safe: whether calls may run in parallel, or a function of the arguments.
        resource_key: for safe calls, a function of the arguments naming the resource
            touched; calls with equal keys never run together.
        idempotent: ``True`` or an ``Idempotency`` policy.
        guard: an ``InputGuard`` for every string argument.
        timeout_s: the longest one attempt may run.
        retry_on_interrupt: whether an attempt interrupted by a lost worker runs again.
    """

    def wrap(func: Callable[..., Any]) -> Tool:
        return Tool(
            func,
            name=name,
            description=description,
            concurrent_safe=concurrent_safe,
            resource_key=resource_key,
            idempotent=idempotent,
            guard=guard,
            timeout_s=timeout_s,
            retry_on_interrupt=retry_on_interrupt,
        )

    return wrap if fn is None else wrap(fn)


class ToolRegistry:
    """The tools a worker can run, by exact, case-sensitive name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        """Create a registry and register ``tools`` in order."""
        self._tools: dict[str, Tool] = {}
        self._frozen = False
        for item in tools:
            self.register(item)

    def register(self, item: Tool) -> Tool:
        """Add a tool.

        Raises:
            DuplicateToolError: the name is taken.
            RegistryFrozenError: a worker was already built on this registry.
            TypeError: ``item`` is not a ``Tool`` (decorate the function with ``@tool``).
        """
        if not isinstance(item, Tool):
            raise TypeError(f"expected a Tool (decorate {item!r} with @tool), got {type(item)}")
        if self._frozen:
            raise RegistryFrozenError(
                f"cannot register {item.name!r}: a worker was built on this registry; "
                "register every tool before building the worker"
            )
        if item.name in self._tools:
            raise DuplicateToolError(f"a tool named {item.name!r} is already registered")
        self._tools[item.name] = item
        return item

    def freeze(self) -> None:
        """Refuse further registrations (``build_worker`` calls this)."""
        self._frozen = True

    def lookup(self, name: str) -> Tool | None:
        """Return the tool called exactly ``name``, or ``None``."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools[name] for name in self.names())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def tools(self) -> list[ToolSpec]:
        """Return the catalog, sorted by name."""
        return [item.spec() for item in self]

    def json_schemas(self) -> dict[str, dict[str, Any]]:
        """Return each tool's parameter schema by name."""
        return {spec.name: spec.parameters for spec in self.tools()}

    def openai_tools(self) -> list[dict[str, Any]]:
        """Return the catalog in OpenAI's ``tools`` format."""
        return [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in self.tools()
        ]

    def anthropic_tools(self) -> list[dict[str, Any]]:
        """Return the catalog in Anthropic's ``tools`` format."""
        return [
            {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
            for spec in self.tools()
        ]
