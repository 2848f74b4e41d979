"""Defining tools: ``@tool``, ``ToolContext``, ``ToolRegistry`` and dynamic tools.

A static tool's parameters become a generated pydantic model (frozen, no inf/NaN), so the JSON
schema, the validation and the coercion of arguments all come from the function's type hints.
``Tool.validate`` runs the guardrail pipeline of spec §4.2 (validate raw, materialize once,
validate effective, freeze) and returns a ``Snapshot``; ``Tool.invoke`` runs the body on deep
copies of it. A dynamic tool (``ToolRegistry.register_dynamic``) offers the same two methods,
but passes the raw arguments through unvalidated: its remote side owns validation.

This module runs worker-side and client-side, never in workflow code.

This package is what an application writes: tools (here), guards, access, idempotency,
MCP toolsets, scratch directories and body lanes. May import: ``tooltrail.errors``,
``tooltrail.core`` and ``tooltrail.settings``; never the database, the pipeline or Temporal's
worker.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import json
import logging
import re
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_type_hints, overload

from pydantic import AliasChoices, AliasPath, BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo
from temporalio import activity

from tooltrail.core.results import ToolOutput
from tooltrail.errors import (
    DuplicateToolError,
    RegistryFrozenError,
    ToolDefinitionError,
    TooltrailError,
)
from tooltrail.tools.body_lanes import run_async_body, run_sync_body
from tooltrail.tools.guards import (
    Guard,
    GuardrailViolation,
    InputGuard,
    Limits,
    as_input_guard,
    inherited_default,
    readonly_view,
)
from tooltrail.tools.idempotency import Idempotency, IdempotencyDeclaration

__all__ = [
    "GUARDRAIL_PREFIX",
    "ArgumentsRejected",
    "DynamicHandler",
    "DynamicTool",
    "Snapshot",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolSpec",
    "UnknownToolError",
    "canonical_json",
    "guardrail_text",
    "tool",
]

log = logging.getLogger("tooltrail.tools")

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


class UnknownToolError(TooltrailError, KeyError):
    """Raised when a name resolves to no registered tool (exact, case-sensitive match).

    ``str(e)`` is exactly ``unknown tool: '<name>'`` (``KeyError`` would add quotes).
    """

    def __init__(self, tool_name: str) -> None:
        """Create the error for ``tool_name``."""
        super().__init__(f"unknown tool: '{tool_name}'")
        self.tool_name = tool_name

    def __str__(self) -> str:
        return f"unknown tool: '{self.tool_name}'"


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of a JSON value: sorted keys, no spaces, UTF-8, no NaN.

    Raises:
        ValueError: ``value`` holds NaN or an infinity.
        TypeError: ``value`` is not JSON data.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The arguments of one call, as ``validate`` accepted them; pass it to ``invoke``.

    For a static tool it is the *effective snapshot* of spec §4.3: the materialized model plus
    its canonical bytes, computed once. Idempotency keys and the audit row's
    ``effective_arguments`` come from ``canonical``; the body gets deep copies of ``model``.
    For a dynamic tool ``canonical`` is ``None`` (no step 3d ran) and ``arguments`` holds a
    deep copy of the raw arguments.
    """

    model: BaseModel
    """The frozen parameter model. For a dynamic tool, a placeholder holding the raw
    arguments as extras (``model.model_dump()`` returns them); nothing was validated."""
    canonical: bytes | None
    """``canonical_json(model.model_dump(mode="json"))`` (static tools), else ``None``."""
    ignored_arguments: tuple[str, ...] = ()
    """Undeclared argument names that were dropped (``extra="ignore"``), in arrival order."""
    arguments: Mapping[str, Any] | None = None
    """Dynamic tools: a deep copy of the raw arguments (the handler gets another copy)."""
    kind: Literal["static", "dynamic"] = "static"
    """Which kind of tool produced the snapshot."""

    @property
    def effective_arguments(self) -> str | None:
        """The canonical JSON text for the audit row, or ``None`` (dynamic tools)."""
        return None if self.canonical is None else self.canonical.decode("utf-8")


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


GUARDRAIL_PREFIX = "guardrail violation: "
"""Every guardrail rejection text starts with this."""

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


def _validation_items(error: ValidationError) -> list[str]:
    items: list[str] = []
    for err in error.errors(include_input=False, include_url=False):
        location = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        ctx = err.get("ctx") or {}
        kind = err["type"]
        if kind == "string_too_long":
            reason = f"longer than {ctx.get('max_length')} characters"
        elif kind == "string_too_short":
            reason = f"shorter than {ctx.get('min_length')} characters"
        elif kind == "extra_forbidden":
            reason = "unexpected argument"
        else:
            reason = _REASONS.get(kind) or str(err["msg"]).lower()
        items.append(f"{location}: {reason}")
    return items


def guardrail_text(error: ValidationError) -> str:
    """Render a validation error as the soft ``guardrail violation: ...`` text.

    Offending values are never echoed: the text names fields and reasons only.
    """
    return GUARDRAIL_PREFIX + "; ".join(_validation_items(error))


class ArgumentsRejected(Exception):
    """Raised by ``validate`` when the arguments fail a guardrail; carries the soft text.

    ``str(e)`` is the model-facing ``guardrail violation: <field>: <reason>; ...`` text.
    """

    def __init__(
        self,
        text: str,
        *,
        items: Iterable[str] = (),
        stage: Literal["raw", "materialize", "effective", "freeze"] | None = None,
        ignored_arguments: Iterable[str] = (),
    ) -> None:
        """Create the rejection.

        Args:
            text: the soft text.
            items: its ``<field>: <reason>`` items.
            stage: the step that rejected: ``raw`` (3a), ``materialize`` (3b),
                ``effective`` (3c) or ``freeze`` (3d).
            ignored_arguments: undeclared argument names seen before the rejection.
        """
        super().__init__(text)
        self.text = text
        self.items = tuple(items)
        self.stage = stage
        self.ignored_arguments = tuple(ignored_arguments)

    @classmethod
    def of(
        cls,
        items: Iterable[str],
        *,
        stage: Literal["raw", "materialize", "effective", "freeze"],
        ignored_arguments: Iterable[str] = (),
    ) -> ArgumentsRejected:
        """Build the rejection whose text joins ``items`` with ``"; "``."""
        items = tuple(items)
        return cls(
            GUARDRAIL_PREFIX + "; ".join(items),
            items=items,
            stage=stage,
            ignored_arguments=ignored_arguments,
        )


# -- guard plumbing -----------------------------------------------------------------------------

_NO_LIMITS = Limits()
_MAX_DEPTH = 64
"""Deeper argument data is refused by a guarded field instead of being walked."""


def _guards_in(annotation: Any, depth: int = 0) -> Iterator[Guard]:
    """Every ``Guard`` in an annotation's ``Annotated[...]`` metadata, nested ones included.

    Models are not entered: their own fields' guards apply when their values are checked.
    """
    if depth > 16:
        return
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, Guard):
                yield meta
    for arg in typing.get_args(annotation):
        if not isinstance(arg, str | int | float | bool | bytes) and arg is not None:
            yield from _guards_in(arg, depth + 1)


def _alias_keys(alias: object) -> Iterator[str]:
    if isinstance(alias, str):
        yield alias
    elif isinstance(alias, AliasPath) and alias.path and isinstance(alias.path[0], str):
        yield alias.path[0]
    elif isinstance(alias, AliasChoices):
        for choice in alias.choices:
            yield from _alias_keys(choice)


@dataclass(frozen=True)
class _FieldPlan:
    name: str
    """The attribute name."""
    loc: str
    """How error texts name it (the alias, as pydantic does, else the name)."""
    keys: tuple[str, ...]
    """Raw argument keys that feed it."""
    limits: Limits
    """Its field-level limits."""


@functools.lru_cache(maxsize=1024)
def _model_plan(model: type[BaseModel]) -> tuple[_FieldPlan, ...]:
    plans = []
    for name, info in model.model_fields.items():
        limits = _NO_LIMITS
        guards = [meta for meta in info.metadata if isinstance(meta, Guard)]
        guards.extend(_guards_in(info.annotation))
        for guard in guards:
            limits = limits.merge(guard.limits)
        keys = dict.fromkeys([name, *_alias_keys(info.alias), *_alias_keys(info.validation_alias)])
        loc = info.alias if isinstance(info.alias, str) else name
        plans.append(_FieldPlan(name, loc, tuple(keys), limits))
    return tuple(plans)


def _scan_raw(value: Any, path: str, limits: Limits, items: list[str], depth: int = 0) -> None:
    """Check every string of raw (JSON-like) data against ``limits``."""
    if isinstance(value, str):
        reason = limits.reason(value)
        if reason is not None:
            items.append(f"{path}: {reason}")
    elif depth >= _MAX_DEPTH and isinstance(value, Mapping | list | tuple):
        items.append(f"{path}: nested too deeply")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _scan_raw(item, f"{path}.{key}", limits, items, depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _scan_raw(item, f"{path}.{index}", limits, items, depth + 1)


def _scan_value(value: Any, path: str, limits: Limits, items: list[str], depth: int = 0) -> None:
    """Check every string of a materialized value; nested models add their fields' guards."""
    if isinstance(value, str):
        if limits:
            reason = limits.reason(value)
            if reason is not None:
                items.append(f"{path}: {reason}")
    elif isinstance(value, BaseModel | Mapping | list | tuple | set | frozenset):
        if depth >= _MAX_DEPTH:
            items.append(f"{path}: nested too deeply")
        elif isinstance(value, BaseModel):
            _scan_model(value, f"{path}.", limits, items, depth + 1)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                _scan_value(item, f"{path}.{key}", limits, items, depth + 1)
        else:
            for index, item in enumerate(value):
                _scan_value(item, f"{path}.{index}", limits, items, depth + 1)


def _scan_model(
    model: BaseModel, prefix: str, limits: Limits, items: list[str], depth: int = 0
) -> None:
    for plan in _model_plan(type(model)):
        value = getattr(model, plan.name, None)
        _scan_value(value, prefix + plan.loc, limits.merge(plan.limits), items, depth)


def _validator_items(exc: Exception, tool_name: str) -> list[str]:
    if isinstance(exc, GuardrailViolation):
        return [exc.item]
    if isinstance(exc, ValidationError):
        return _validation_items(exc)
    if isinstance(exc, ValueError):
        return [f"(arguments): {str(exc) or 'rejected'}"]
    # A validator bug must not crash the attempt, nor let the call through: fail closed.
    log.error("a guard validator of tool %r raised", tool_name, exc_info=exc)
    return [f"(arguments): guard validator failed ({type(exc).__name__})"]


def _is_method(fn: Callable[..., Any], params: list[inspect.Parameter]) -> bool:
    """Whether ``fn`` is a function defined in a class body with an unannotated ``self``."""
    if not params or params[0].name != "self" or params[0].annotation is not params[0].empty:
        return False
    parts = getattr(fn, "__qualname__", "").split(".")
    return len(parts) >= 2 and parts[-2] != "<locals>"


def _is_async_callable(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  (an object with an async __call__)
    )


Extra = Literal["ignore", "forbid"]


class Tool:
    """A registered tool: a function plus its parameter model and dispatch declarations.

    A ``@tool`` on a method (first parameter an unannotated ``self``) makes a *method tool*:
    reading it from an instance (``kit.search``) gives a tool bound to that instance, which is
    what you register; ``@tool_defaults`` on the class supplies its defaults.
    """

    kind: ClassVar[Literal["static", "dynamic"]] = "static"
    """``"static"`` (this class) or ``"dynamic"`` (``DynamicTool``)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
        resource_key: Callable[[dict[str, Any]], str | None] | None = None,
        idempotent: IdempotencyDeclaration = None,
        guard: InputGuard | Guard | None = None,
        extra: Extra | None = None,
        timeout_s: float | None = None,
        retry_on_interrupt: bool = True,
        local: bool = False,
        own_loop: bool = True,
        loop_thresholds: int | None = None,
        primary_param: str | None = None,
        loop_suggestion: str | None = None,
    ) -> None:
        """Build a tool from a function; prefer the ``@tool`` decorator.

        Raises:
            ToolDefinitionError: the name is invalid, a parameter is ``*args``, ``**kwargs``,
                positional-only or unannotated, ``guard`` is not an ``InputGuard``,
                ``extra`` is neither ``"ignore"`` nor ``"forbid"``, or ``local=True`` is
                combined with ``retry_on_interrupt=False``, ``loop_thresholds`` is not a
                positive int, or ``primary_param`` names no parameter of the tool.
        """
        self.fn = fn
        self._func = fn
        self.name = fn.__name__ if name is None else name
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} of {fn.__qualname__!r} is invalid: "
                "use 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
            )
        if extra not in (None, "ignore", "forbid"):
            raise ToolDefinitionError(
                f"extra of tool {self.name!r} must be 'ignore' or 'forbid', got {extra!r}"
            )
        summary, arg_docs = _docstring_parts(fn.__doc__)
        self.description = summary if description is None else description
        self.concurrent_safe = concurrent_safe
        self.resource_key = resource_key
        self._declared_idempotent: IdempotencyDeclaration = idempotent
        self._declared_guard = as_input_guard(guard)
        self._globals: Mapping[str, Any] | None = getattr(fn, "__globals__", None)
        self._owner: type | None = None
        self._attr: str | None = None
        self._instance: object | None = None
        self.timeout_s = timeout_s
        self.retry_on_interrupt = retry_on_interrupt
        if local and not retry_on_interrupt:
            # A local attempt leaves no heartbeat behind, so a lost worker's attempt cannot
            # be told from a fresh one: it simply runs again.
            raise ToolDefinitionError(
                f"tool {self.name!r}: local=True cannot be combined with "
                "retry_on_interrupt=False (a local attempt lost with its worker always runs "
                "again)"
            )
        self.local = local
        self.own_loop = own_loop
        """An ``async def`` body runs on an event loop of its own inside a worker
        (``tooltrail.tools.body_lanes``), so a blocking call in it cannot stop the worker's
        heartbeats; ``False`` runs it on the worker's loop (it shares loop-bound objects)."""
        if loop_thresholds is not None and (
            isinstance(loop_thresholds, bool)
            or not isinstance(loop_thresholds, int)
            or loop_thresholds < 1
        ):
            raise ToolDefinitionError(
                f"loop_thresholds of tool {self.name!r} must be a positive int, "
                f"got {loop_thresholds!r}"
            )
        self.loop_thresholds = loop_thresholds
        self.primary_param = primary_param
        self.loop_suggestion = loop_suggestion or None
        self.is_async = inspect.iscoroutinefunction(fn)
        self.context_param: str | None = None
        self._model_param: str | None = None
        self.is_method = False
        self.params_model = self._build_model(arg_docs, extra or "ignore")
        if extra is None and self._model_param is not None:
            # A model used as is keeps its own extra policy when it forbids.
            forbids = self.params_model.model_config.get("extra") == "forbid"
            extra = "forbid" if forbids else "ignore"
        self.extra: Literal["ignore", "forbid", "allow"] = extra or "ignore"
        self._declared_keys = frozenset(
            key for plan in _model_plan(self.params_model) for key in plan.keys
        )
        if primary_param is not None and primary_param not in self.params_model.model_fields:
            raise ToolDefinitionError(
                f"primary_param of tool {self.name!r} must name one of its parameters "
                f"({', '.join(sorted(self.params_model.model_fields)) or 'none'}), "
                f"got {primary_param!r}"
            )

    def _build_model(self, arg_docs: dict[str, str], extra: Extra) -> type[BaseModel]:
        fn = self.fn
        try:
            hints = get_type_hints(fn, include_extras=True)
        except ToolDefinitionError:
            raise
        except Exception as exc:
            raise ToolDefinitionError(
                f"cannot resolve the type hints of tool function {fn.__qualname__!r}: {exc}"
            ) from exc
        fields: dict[str, Any] = {}
        params = list(inspect.signature(fn).parameters.values())
        if _is_method(fn, params):
            self.is_method = True
            params = params[1:]
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
        try:
            return create_model(
                f"{model_name}Arguments",
                __config__=ConfigDict(frozen=True, extra=extra, allow_inf_nan=False),
                **fields,
            )
        except ToolDefinitionError:
            raise
        except Exception as exc:
            raise ToolDefinitionError(
                f"cannot build the parameter model of tool function {fn.__qualname__!r}: {exc}"
            ) from exc

    # -- defaults (method > class > module) ------------------------------------------------------

    @property
    def guard(self) -> InputGuard | None:
        """The tool-level guard: the tool's own, else its class's, else its module's default."""
        if self._declared_guard is not None:
            return self._declared_guard
        inherited: InputGuard | None = inherited_default("guard", self._owner, self._globals)
        return inherited

    @guard.setter
    def guard(self, value: InputGuard | Guard | None) -> None:
        self._declared_guard = as_input_guard(value)

    @property
    def idempotent(self) -> bool | Idempotency:
        """The idempotency declaration: the tool's own, else its class's, else its module's.

        ``False`` when nobody declared one. Setting ``None`` makes the tool inherit again.
        """
        if self._declared_idempotent is not None:
            return self._declared_idempotent
        inherited: IdempotencyDeclaration = inherited_default(
            "idempotent", self._owner, self._globals
        )
        return False if inherited is None else inherited

    @idempotent.setter
    def idempotent(self, value: IdempotencyDeclaration) -> None:
        self._declared_idempotent = value

    def check_definition(self) -> None:
        """Resolve the inherited defaults now, so a bad one fails at registration.

        Raises:
            ToolDefinitionError: a module's ``TOOLTRAIL_DEFAULTS`` is not a ``ToolDefaults``.
            TypeError: this is a method tool read from its class, not from an instance.
        """
        if self.is_method and self._instance is None:
            raise TypeError(
                f"tool {self.name!r} is a method of {self._owner.__name__ if self._owner else '?'}"
                "; register the tool of an instance (registry.register(kit."
                f"{self._attr or self.name}) or registry.register_toolkit(kit))"
            )
        _ = self.guard, self.idempotent

    # -- method tools ----------------------------------------------------------------------------

    def __set_name__(self, owner: type, name: str) -> None:
        if self.is_method and self._instance is None:
            self._owner = owner
            self._attr = name

    def __get__(self, instance: object, owner: type | None = None) -> Tool:
        if instance is None or not self.is_method or self._instance is not None:
            return self
        bound = copy.copy(self)
        bound.fn = types.MethodType(self._func, instance)
        bound._instance = instance
        bound._owner = type(instance)
        if self._attr is not None:
            # Later reads of the attribute find this one (a Tool is a non-data descriptor).
            with contextlib.suppress(TypeError):
                vars(instance)[self._attr] = bound
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    # -- catalog ---------------------------------------------------------------------------------

    def parameters_schema(self) -> dict[str, Any]:
        """Return the JSON schema of the parameters (validation mode, no generated titles).

        ``"additionalProperties": false`` appears only with ``extra="forbid"``; a field's
        ``Guard(max_length=n)`` appears as ``"maxLength": n``; blocked patterns never appear.
        """
        schema: dict[str, Any] = _strip_titles(self.params_model.model_json_schema())
        schema.setdefault("properties", {})
        schema.setdefault("type", "object")
        if self.extra == "forbid":
            schema["additionalProperties"] = False
        else:
            schema.pop("additionalProperties", None)
        return schema

    def spec(self) -> ToolSpec:
        """Return the tool's catalog entry."""
        return ToolSpec(self.name, self.description, self.parameters_schema(), self.kind)

    def is_safe_for(self, arguments: dict[str, Any]) -> bool:
        """Return whether this call may run concurrently with others."""
        if callable(self.concurrent_safe):
            return bool(self.concurrent_safe(arguments))
        return bool(self.concurrent_safe)

    def key_for(self, arguments: dict[str, Any]) -> str | None:
        """Return the resource key of a concurrent-safe call, or ``None``."""
        return None if self.resource_key is None else self.resource_key(arguments)

    # -- the guardrail pipeline (spec §4.2) ------------------------------------------------------

    def validate(self, arguments: Mapping[str, Any] | None) -> Snapshot:
        """Run steps 3a-3d on the raw arguments and return the frozen snapshot.

        3a checks that the arguments are an object with string keys, applies ``max_length``
        and blocked patterns to the raw strings of declared fields, handles undeclared keys
        (``extra``), then runs the guard's ``raw_validators``. 3b materializes the parameter
        model exactly once (lax mode: defaults, factories, coercions). 3c applies the same
        limits to the materialized values, then the guard's ``validators``. 3d computes the
        canonical bytes.

        Args:
            arguments: the raw arguments; ``None`` means ``{}``.

        Returns:
            The snapshot: the model, its canonical bytes and the ignored argument names.

        Raises:
            ArgumentsRejected: with the soft ``guardrail violation: ...`` text.
        """
        raw: Any = {} if arguments is None else arguments
        if not isinstance(raw, Mapping):
            raise ArgumentsRejected.of(["(arguments): not a valid object"], stage="raw")
        if not all(isinstance(key, str) for key in raw):
            raise ArgumentsRejected.of(["(arguments): keys must be strings"], stage="raw")
        guard = self.guard
        tool_limits = guard.limits if guard is not None else _NO_LIMITS

        # 3a. Validate raw: stop hostile input before any coercion work is spent on it.
        kept, ignored = self._validate_raw(raw, tool_limits)
        if guard is not None and guard.raw_validators:
            view = readonly_view(raw)
            for raw_validator in guard.raw_validators:
                self._run_validator(raw_validator, view, stage="raw", ignored=ignored)

        # 3b. Materialize once. The copy keeps the model from aliasing the caller's data.
        try:
            model = self.params_model.model_validate(copy.deepcopy(kept))
        except ValidationError as exc:
            raise ArgumentsRejected.of(
                _validation_items(exc), stage="materialize", ignored_arguments=ignored
            ) from exc

        # 3c. Validate effective: a default or a coercion may break a limit.
        items: list[str] = []
        _scan_model(model, "", tool_limits, items)
        if items:
            raise ArgumentsRejected.of(items, stage="effective", ignored_arguments=ignored)
        if guard is not None:
            for validator in guard.validators:
                copied = model.model_copy(deep=True)
                self._run_validator(validator, copied, stage="effective", ignored=ignored)

        # 3d. Freeze.
        try:
            canonical = canonical_json(model.model_dump(mode="json"))
        except (ValueError, TypeError) as exc:
            raise ArgumentsRejected.of(
                ["(arguments): not representable as JSON"],
                stage="freeze",
                ignored_arguments=ignored,
            ) from exc
        return Snapshot(model=model, canonical=canonical, ignored_arguments=tuple(ignored))

    def _validate_raw(
        self, raw: Mapping[str, Any], tool_limits: Limits
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Split declared from undeclared keys and apply the limits to raw strings (3a)."""
        kept: dict[str, Any] = {}
        ignored: list[str] = []
        for key, value in raw.items():
            if key in self._declared_keys:
                kept[key] = value
            else:
                ignored.append(key)
        items: list[str] = []
        for plan in _model_plan(self.params_model):
            limits = tool_limits.merge(plan.limits)
            for key in plan.keys:
                if limits and key in kept:
                    _scan_raw(kept[key], key, limits, items)
        if self.extra == "forbid":
            items.extend(f"{key}: unexpected argument" for key in ignored)
        if items:
            raise ArgumentsRejected.of(items, stage="raw", ignored_arguments=ignored)
        return kept, tuple(ignored)

    def _run_validator(
        self,
        validator: Callable[[Any], object],
        argument: Any,
        *,
        stage: Literal["raw", "effective"],
        ignored: tuple[str, ...],
    ) -> None:
        try:
            validator(argument)
        except Exception as exc:
            raise ArgumentsRejected.of(
                _validator_items(exc, self.name), stage=stage, ignored_arguments=ignored
            ) from exc

    async def invoke(self, ctx: ToolContext, snapshot: Snapshot | BaseModel) -> Any:
        """Run the body on a deep copy of the validated arguments; sync bodies run in a thread.

        Exceptions from the body propagate; the caller isolates them.

        Args:
            ctx: the call's context (injected if the function declares it).
            snapshot: what ``validate`` returned (a bare parameter model is accepted too).
        """
        if self.is_method and self._instance is None:
            self.check_definition()
        model = snapshot.model if isinstance(snapshot, Snapshot) else snapshot
        if not isinstance(model, self.params_model):
            raise TypeError(
                f"tool {self.name!r} needs the snapshot its validate() returned, got {snapshot!r}"
            )
        if self._model_param is not None:
            kwargs: dict[str, Any] = {self._model_param: model.model_copy(deep=True)}
        else:
            kwargs = {
                name: copy.deepcopy(getattr(model, name)) for name in type(model).model_fields
            }
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        if self.is_async:
            if self.own_loop and _in_worker_activity():
                return await run_async_body(self.name, lambda: self.fn(**kwargs))
            return await self.fn(**kwargs)
        return await run_sync_body(self.name, functools.partial(self.fn, **kwargs))


DynamicHandler = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
"""``async (arguments, ctx) -> JSON value``: the body of a dynamic tool."""


class _DynamicArguments(BaseModel):
    """Placeholder parameter model of dynamic tools (their arguments are never validated)."""

    model_config = ConfigDict(frozen=True, extra="allow")


class DynamicTool(Tool):
    """A tool registered at runtime with a JSON schema and an async handler.

    For example a remote MCP tool's proxy; see ``ToolRegistry.register_dynamic``.

    Its arguments are not validated against the schema (the remote side owns that), it runs
    no guardrails and is never idempotent; the handler gets a deep copy of the raw arguments.
    It has the interface of a static ``Tool``, so the tool activity runs it the same way.
    """

    kind: ClassVar[Literal["static", "dynamic"]] = "dynamic"

    def __init__(
        self,
        name: str,
        *,
        description: str,
        parameters: Mapping[str, Any],
        handler: DynamicHandler,
    ) -> None:
        """Create the tool (prefer ``registry.register_dynamic``).

        Raises:
            ToolDefinitionError: the name is invalid, or ``parameters`` is not a JSON object.
            TypeError: ``handler`` is not callable or ``description`` is not a string.
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolDefinitionError(
                f"dynamic tool name {name!r} is invalid: "
                "use 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
            )
        if not callable(handler):
            raise TypeError(f"the handler of dynamic tool {name!r} is not callable: {handler!r}")
        if not isinstance(description, str):
            raise TypeError(f"the description of dynamic tool {name!r} must be a str")
        if not isinstance(parameters, Mapping):
            raise ToolDefinitionError(
                f"the parameters of dynamic tool {name!r} must be a JSON Schema object"
            )
        try:
            self._parameters: dict[str, Any] = json.loads(json.dumps(dict(parameters)))
        except (TypeError, ValueError) as exc:
            raise ToolDefinitionError(
                f"the parameters of dynamic tool {name!r} are not JSON-serialisable: {exc}"
            ) from exc
        self.fn = handler
        self._func = handler
        self.name = name
        self.description = description
        self.concurrent_safe = False
        self.resource_key = None
        self._declared_idempotent = False
        self._declared_guard = None
        self._globals = None
        self._owner = None
        self._attr = None
        self._instance = None
        self.timeout_s = None
        self.retry_on_interrupt = True
        # Dynamic handlers (MCP sessions, say) hold objects bound to the worker's loop.
        self.own_loop = False
        self.local = False
        self.loop_thresholds = None
        self.primary_param = None
        self.loop_suggestion = None
        self.is_async = _is_async_callable(handler)
        self.context_param = None
        self._model_param = None
        self.is_method = False
        self.params_model = _DynamicArguments
        self.extra = "allow"
        self._declared_keys = frozenset()

    def parameters_schema(self) -> dict[str, Any]:
        """Return the schema exactly as registered (a copy)."""
        return copy.deepcopy(self._parameters)

    def validate(self, arguments: Mapping[str, Any] | None) -> Snapshot:
        """Return a snapshot holding a deep copy of the raw arguments; nothing is checked.

        Raises:
            ArgumentsRejected: only if ``arguments`` is not a mapping at all.
        """
        raw: Any = {} if arguments is None else arguments
        if not isinstance(raw, Mapping):
            raise ArgumentsRejected.of(["(arguments): not a valid object"], stage="raw")
        arguments = copy.deepcopy(dict(raw))
        model = _DynamicArguments.model_construct()
        # Extras only, never validated: the placeholder just carries the raw arguments.
        object.__setattr__(model, "__pydantic_extra__", dict(arguments))
        return Snapshot(model=model, canonical=None, arguments=arguments, kind="dynamic")

    async def invoke(
        self, ctx: ToolContext, snapshot: Snapshot | BaseModel | Mapping[str, Any]
    ) -> Any:
        """Run the handler on a deep copy of the snapshot's raw arguments."""
        if isinstance(snapshot, Snapshot):
            if snapshot.arguments is None:
                raise TypeError(
                    f"dynamic tool {self.name!r} needs a snapshot of its own validate()"
                )
            arguments = copy.deepcopy(dict(snapshot.arguments))
        elif isinstance(snapshot, BaseModel):
            arguments = snapshot.model_dump(mode="json")
        else:
            arguments = copy.deepcopy(dict(snapshot))
        if self.is_async:
            return await self.fn(arguments, ctx)
        result = await run_sync_body(self.name, functools.partial(self.fn, arguments, ctx))
        if inspect.isawaitable(result):
            result = await result
        return result


def _in_worker_activity() -> bool:
    # Inside a (non-local) activity: the body shares the worker's event loop with every
    # heartbeat and workflow task. A local activity's body stays (its timeout bounds it).
    try:
        return not activity.info().is_local
    except RuntimeError:
        return False


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
    idempotent: IdempotencyDeclaration = None,
    guard: InputGuard | Guard | None = None,
    extra: Extra | None = None,
    timeout_s: float | None = None,
    retry_on_interrupt: bool = True,
    local: bool = False,
    own_loop: bool = True,
    loop_thresholds: int | None = None,
    primary_param: str | None = None,
    loop_suggestion: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrent_safe: bool | Callable[[dict[str, Any]], bool] = False,
    resource_key: Callable[[dict[str, Any]], str | None] | None = None,
    idempotent: IdempotencyDeclaration = None,
    guard: InputGuard | Guard | None = None,
    extra: Extra | None = None,
    timeout_s: float | None = None,
    retry_on_interrupt: bool = True,
    local: bool = False,
    own_loop: bool = True,
    loop_thresholds: int | None = None,
    primary_param: str | None = None,
    loop_suggestion: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: ``@tool`` or ``@tool(name=..., ...)`` on a ``def`` or ``async def``.

    Args:
        fn: the function, when used bare.
        name: the tool name (default: the function name).
        description: the description (default: the docstring's first paragraph).
        concurrent_safe: whether calls may run in parallel, or a function of the arguments.
        resource_key: for safe calls, a function of the arguments naming the resource
            touched; calls with equal keys never run together.
        idempotent: ``True``, ``False`` or an ``Idempotency`` policy (an
            ``IdempotencyDeclaration``); ``None`` (the default) declares nothing, so the tool
            inherits ``@tool_defaults`` of its class, then ``TOOLTRAIL_DEFAULTS`` of its
            module, else it is not idempotent.
        guard: an ``InputGuard`` for every string argument; ``None`` inherits like
            ``idempotent``. The nearest declaration replaces the others.
        extra: what undeclared arguments do: ``"ignore"`` (dropped and reported as
            ``Snapshot.ignored_arguments``; the default) or ``"forbid"`` (a violation).
        timeout_s: the longest one attempt may run.
        retry_on_interrupt: whether an attempt interrupted by a lost worker runs again.
        local: run each attempt as a Temporal *local activity*: in the worker that runs the
            turn, without a server round trip of its own, and without the attempt's input
            in the workflow history. For fast (milliseconds), side-effect-free or
            idempotent tools. The trade-off: no heartbeats (only the timeout bounds a hung
            body, and cancellation is best-effort), and an attempt whose worker is lost
            before the turn's next workflow task completes runs again, so the body may run
            more than once. The pipeline, the audit trail and recovery are the same.
        own_loop: for an ``async def`` tool: run each body, inside a worker, on an event
            loop of its own (the default), so a blocking call in it cannot stop the
            worker's heartbeats (Temporal would run it again) or its other turns. ``False``
            runs it on the worker's loop, for a body that shares loop-bound objects (an
            ``asyncio.Event`` or a client created on that loop) with the host.
        loop_thresholds: this tool's loop threshold (pipeline spec §10.1, the signature's
            ``tool_thresholds()``): how many identical operations of this tool make a
            pattern; ``None`` uses ``RunConfig.detection.loop_threshold``. The stop
            threshold stays the run's.
        primary_param: the parameter whose value identifies an operation for loop
            detection (§10.2, the signature's ``extract_primary_param``); a string value is
            used as is, any other value as its canonical JSON. ``None`` (or a call without
            it) uses the canonical JSON of the whole input.
        loop_suggestion: the end of the host's loop warning for this tool's patterns
            (default ``Consider a different approach or tool.``).
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
            extra=extra,
            timeout_s=timeout_s,
            retry_on_interrupt=retry_on_interrupt,
            own_loop=own_loop,
            local=local,
            loop_thresholds=loop_thresholds,
            primary_param=primary_param,
            loop_suggestion=loop_suggestion,
        )

    return wrap if fn is None else wrap(fn)


class ToolRegistry:
    """The tools a worker can run, by exact, case-sensitive name.

    Static and dynamic tools share one namespace.
    """

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        """Create a registry and register ``tools`` in order."""
        self._tools: dict[str, Tool] = {}
        self._frozen = False
        for item in tools:
            self.register(item)

    def _admit(self, item: Tool, pending: Mapping[str, Tool] | None = None) -> None:
        if not isinstance(item, Tool):
            raise TypeError(f"expected a Tool (decorate {item!r} with @tool), got {type(item)}")
        item.check_definition()
        if self._frozen:
            raise RegistryFrozenError(
                f"cannot register {item.name!r}: a worker was built on this registry; "
                "register every tool before building the worker"
            )
        if item.name in self._tools or (pending is not None and item.name in pending):
            raise DuplicateToolError(f"a tool named {item.name!r} is already registered")

    def register(self, item: Tool) -> Tool:
        """Add a tool (static or dynamic).

        Raises:
            DuplicateToolError: the name is taken.
            RegistryFrozenError: a worker was already built on this registry.
            ToolDefinitionError: the module's ``TOOLTRAIL_DEFAULTS`` is not a ``ToolDefaults``.
            TypeError: ``item`` is not a ``Tool`` (decorate the function with ``@tool``), or
                is a method tool read from its class instead of an instance.
        """
        self._admit(item)
        self._tools[item.name] = item
        return item

    def register_dynamic(
        self,
        name: str,
        *,
        description: str,
        parameters: Mapping[str, Any],
        handler: DynamicHandler,
        **unsupported: Any,
    ) -> DynamicTool:
        """Add a dynamic tool: a name, a description, a JSON Schema and an async handler.

        The handler, ``async (arguments: dict, ctx: ToolContext) -> JSON value``, gets a deep
        copy of the raw arguments; they are not validated against ``parameters``, which the
        catalog returns exactly as given.

        Raises:
            TypeError: ``idempotent`` or ``guard`` was given (a dynamic tool has nothing to
                carry them), or another unknown keyword.
            DuplicateToolError: the name is taken (by a static or a dynamic tool).
            RegistryFrozenError: a worker was already built on this registry.
            ToolDefinitionError: the name is invalid or ``parameters`` is not a JSON object.
        """
        if unsupported:
            names = ", ".join(sorted(unsupported))
            if {"idempotent", "guard"} & set(unsupported):
                raise TypeError(
                    f"register_dynamic() does not accept {names}: dynamic tools cannot be "
                    "idempotent or guarded (the remote side validates its own arguments)"
                )
            raise TypeError(f"register_dynamic() got unexpected keyword arguments: {names}")
        item = DynamicTool(name, description=description, parameters=parameters, handler=handler)
        self.register(item)
        return item

    def _register_all(self, items: Iterable[Tool]) -> list[Tool]:
        # All or nothing: check every tool before adding any.
        pending: dict[str, Tool] = {}
        for item in items:
            self._admit(item, pending)
            pending[item.name] = item
        self._tools.update(pending)
        return list(pending.values())

    def register_module(self, module: types.ModuleType) -> list[Tool]:
        """Add every ``Tool`` bound to a name in ``module``, in definition order.

        The module's ``TOOLTRAIL_DEFAULTS`` apply to the tools defined in it. Method tools of
        classes are skipped (register an instance with ``register_toolkit``).

        Returns:
            The tools added.

        Raises:
            DuplicateToolError, RegistryFrozenError, ToolDefinitionError: as ``register``;
                nothing is added then.
        """
        found: dict[int, Tool] = {}
        for value in vars(module).values():
            if isinstance(value, Tool) and not (value.is_method and value._instance is None):
                found.setdefault(id(value), value)
        return self._register_all(found.values())

    def register_toolkit(self, toolkit: object) -> list[Tool]:
        """Add the ``@tool`` methods of ``toolkit``, bound to it, in definition order.

        Returns:
            The tools added.

        Raises:
            DuplicateToolError, RegistryFrozenError, ToolDefinitionError: as ``register``;
                nothing is added then.
        """
        names: dict[str, None] = {}
        for klass in reversed(type(toolkit).__mro__):
            for attr, value in vars(klass).items():
                if isinstance(value, Tool) and value.is_method:
                    names[attr] = None
        tools = [getattr(toolkit, attr) for attr in names]
        return self._register_all(item for item in tools if isinstance(item, Tool))

    def freeze(self) -> None:
        """Refuse further registrations (``build_worker`` calls this)."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        """Whether a worker was built on this registry."""
        return self._frozen

    def lookup(self, name: str) -> Tool | None:
        """Return the tool called exactly ``name``, or ``None``."""
        return self._tools.get(name)

    def resolve(self, name: str) -> Tool:
        """Return the tool called exactly ``name``.

        Raises:
            UnknownToolError: no tool has that name.
        """
        found = self._tools.get(name)
        if found is None:
            raise UnknownToolError(name)
        return found

    def __getitem__(self, name: str) -> Tool:
        return self.resolve(name)

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
