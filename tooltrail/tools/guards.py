r"""Input guardrails: declarative limits and validators on a static tool's arguments.

Three places declare them, nearest first:

- a parameter: ``Annotated[str, Guard(max_length=200, blocked_patterns=(r"(?i)drop\s+table",))]``;
- the tool: ``@tool(guard=InputGuard(...))``, whose limits apply to every declared argument on
  top of the field-level guards;
- the tool's defaults: ``@tool_defaults(guard=...)`` on a toolkit class, then
  ``TOOLTRAIL_DEFAULTS = ToolDefaults(guard=...)`` in the tool function's module. The nearest
  tool-level ``guard`` replaces the inherited ones wholesale; it is never merged with them.

The checks run in ``Tool.validate`` (spec §4.2): once on the raw arguments (3a) and again on
the materialized model (3c). A limit counts code points and applies to every string at the
guarded field, nested ones included. Blocked patterns are compiled when the guard is built, so
an invalid one fails at definition time with ``ToolDefinitionError``; they never appear in the
JSON schema, so the model never learns what is filtered.

Module-level defaults are read from the tool function's globals each time they are needed,
so ``TOOLTRAIL_DEFAULTS`` may be assigned anywhere in the module. Class-level defaults reach
only tools that are methods of the decorated class (and of its subclasses).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tooltrail.errors import ToolDefinitionError

if TYPE_CHECKING:
    from pydantic import BaseModel, GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import CoreSchema

    from tooltrail.tools.idempotency import IdempotencyDeclaration

__all__ = [
    "DEFAULTS_ATTRIBUTE",
    "MODULE_DEFAULTS_NAME",
    "Guard",
    "GuardrailViolation",
    "InputGuard",
    "ModelValidator",
    "RawValidator",
    "ToolDefaults",
    "readonly_view",
    "tool_defaults",
]

MODULE_DEFAULTS_NAME = "TOOLTRAIL_DEFAULTS"
"""The module global holding a module's ``ToolDefaults``."""

DEFAULTS_ATTRIBUTE = "__tooltrail_defaults__"
"""The class attribute ``@tool_defaults`` sets."""

RawValidator = Callable[[Mapping[str, Any]], object]
"""Gets a deeply read-only view of the raw arguments; rejects by raising ``ValueError``."""

ModelValidator = Callable[["BaseModel"], object]
"""Gets (a deep copy of) the materialized parameter model; rejects by raising ``ValueError``."""

_C = TypeVar("_C", bound=type)


class GuardrailViolation(ValueError):
    """Raised by a guard validator to reject the arguments, naming the offending field.

    A plain ``ValueError(msg)`` rejects too, reported against ``(arguments)``. The message is
    shown to the model verbatim, so it must not echo a secret value.
    """

    def __init__(self, field: str | Sequence[str | int] | None, msg: str) -> None:
        """Create the violation.

        Args:
            field: the field's dotted location (``"items.0.name"``), its path as a sequence,
                or ``None`` for the arguments as a whole.
            msg: the reason, for example ``"must be a weekday"``.
        """
        if field is not None and not isinstance(field, str):
            field = ".".join(str(part) for part in field)
        super().__init__(msg)
        self.field: str | None = field or None
        self.msg = msg

    @property
    def item(self) -> str:
        """The ``<field>: <reason>`` item of the rejection text."""
        return f"{self.field or '(arguments)'}: {self.msg}"


def _declared_patterns(patterns: object) -> tuple[str | re.Pattern[str], ...]:
    # A lone string is one pattern, not an iterable of one-character patterns.
    if isinstance(patterns, str | re.Pattern):
        return (patterns,)
    if not isinstance(patterns, Iterable):
        raise ToolDefinitionError(
            f"blocked_patterns must be a sequence of regular expressions, got {patterns!r}"
        )
    return tuple(patterns)


def _compile_patterns(patterns: Iterable[object]) -> tuple[re.Pattern[str], ...]:
    compiled: list[re.Pattern[str]] = []
    for pattern in patterns:
        if isinstance(pattern, re.Pattern):
            if not isinstance(pattern.pattern, str):
                raise ToolDefinitionError(f"blocked pattern {pattern!r} must match str, not bytes")
            compiled.append(pattern)
        elif isinstance(pattern, str):
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ToolDefinitionError(
                    f"blocked pattern {pattern!r} is not a valid regular expression: {exc}"
                ) from exc
        else:
            raise ToolDefinitionError(
                f"blocked pattern {pattern!r} must be a str or a compiled re.Pattern"
            )
    return tuple(compiled)


def _check_limits(guard: Guard | InputGuard) -> None:
    """Check a guard's declared limits, normalize them and compile its patterns."""
    object.__setattr__(guard, "max_length", _check_max_length(guard.max_length))
    declared = _declared_patterns(guard.blocked_patterns)
    object.__setattr__(guard, "blocked_patterns", declared)
    object.__setattr__(guard, "_compiled", _compile_patterns(declared))


def _check_max_length(max_length: object) -> int | None:
    if max_length is None:
        return None
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
        raise ToolDefinitionError(f"max_length must be a non-negative int, got {max_length!r}")
    return max_length


def _add_max_length(schema: Any, limit: int) -> None:
    """Put ``maxLength`` on every string schema inside ``schema`` (``$ref``s are not followed)."""
    if isinstance(schema, list):
        for item in schema:
            _add_max_length(item, limit)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        current = schema.get("maxLength")
        schema["maxLength"] = limit if not isinstance(current, int) else min(current, limit)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        _add_max_length(schema.get(key), limit)
    for key in ("items", "additionalProperties"):
        _add_max_length(schema.get(key), limit)


@dataclass(frozen=True)
class Guard:
    """Field-level limits: ``Annotated[str, Guard(max_length=200, blocked_patterns=(...))]``.

    Place it anywhere in a parameter's annotation (``Annotated[str, Guard(...)] | None``
    works); it guards every string of that parameter. ``max_length`` shows in the JSON schema
    as ``maxLength``; blocked patterns never do.
    """

    max_length: int | None = None
    """The most code points any string at the field may have."""
    blocked_patterns: tuple[str | re.Pattern[str], ...] = ()
    """Regular expressions (``re.search``) that reject a string they match."""
    _compiled: tuple[re.Pattern[str], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        _check_limits(self)

    @property
    def limits(self) -> Limits:
        """The compiled limits."""
        return Limits(self.max_length, self._compiled)

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # Only the length is advertised: patterns stay secret (spec §3.4).
        schema = handler(core_schema)
        if self.max_length is not None:
            _add_max_length(schema, self.max_length)
        return schema


@dataclass(frozen=True)
class InputGuard:
    """Tool-level guardrails: ``@tool(guard=InputGuard(...))``.

    ``max_length`` and ``blocked_patterns`` apply to every string of every declared argument,
    on top of field-level ``Guard``s. ``raw_validators`` run on a read-only view of the raw
    arguments once the limits passed (step 3a); ``validators`` run on the materialized model
    once the limits passed again (step 3c). A validator rejects by raising ``ValueError`` or
    ``GuardrailViolation``; what it returns is ignored.
    """

    max_length: int | None = None
    """The most code points any string argument may have."""
    blocked_patterns: tuple[str | re.Pattern[str], ...] = ()
    """Regular expressions (``re.search``) that reject a string they match."""
    raw_validators: tuple[RawValidator, ...] = ()
    """Validators of the raw arguments (step 3a)."""
    validators: tuple[ModelValidator, ...] = ()
    """Validators of the materialized model (step 3c)."""
    _compiled: tuple[re.Pattern[str], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        _check_limits(self)
        for name in ("raw_validators", "validators"):
            value = getattr(self, name)
            funcs = (value,) if callable(value) else tuple(value)
            for func in funcs:
                if not callable(func):
                    raise ToolDefinitionError(f"InputGuard.{name} holds {func!r}, not a callable")
            object.__setattr__(self, name, funcs)

    @property
    def limits(self) -> Limits:
        """The compiled limits."""
        return Limits(self.max_length, self._compiled)


@dataclass(frozen=True)
class Limits:
    """Compiled declarative limits of one field (internal; built from guards)."""

    max_length: int | None = None
    patterns: tuple[re.Pattern[str], ...] = ()

    def __bool__(self) -> bool:
        return self.max_length is not None or bool(self.patterns)

    def merge(self, other: Limits) -> Limits:
        """Both sets of limits: the smaller length, every pattern."""
        if not other:
            return self
        if not self:
            return other
        lengths = [n for n in (self.max_length, other.max_length) if n is not None]
        patterns = self.patterns + tuple(p for p in other.patterns if p not in self.patterns)
        return Limits(min(lengths) if lengths else None, patterns)

    def reason(self, text: str) -> str | None:
        """Why ``text`` breaks the limits, or ``None``; never quotes the text.

        A blocked pattern wins over the length: it is the more important thing to report.
        """
        if any(pattern.search(text) for pattern in self.patterns):
            return "matches a blocked pattern"
        if self.max_length is not None and len(text) > self.max_length:
            return f"longer than {self.max_length} characters"
        return None


@dataclass(frozen=True)
class ToolDefaults:
    """Defaults for every tool of a module: ``TOOLTRAIL_DEFAULTS = ToolDefaults(guard=...)``.

    ``None`` means "no default here": the next level (or the built-in) decides.
    """

    guard: InputGuard | None = None
    """The tool-level guard of tools that declare none."""
    idempotent: IdempotencyDeclaration = None
    """The idempotency of tools that declare none (``True``, ``False`` or a policy)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "guard", as_input_guard(self.guard))


def as_input_guard(guard: object) -> InputGuard | None:
    """Accept an ``InputGuard``, a ``Guard`` (limits only) or ``None``.

    Raises:
        ToolDefinitionError: anything else.
    """
    if guard is None or isinstance(guard, InputGuard):
        return guard
    if isinstance(guard, Guard):
        return InputGuard(max_length=guard.max_length, blocked_patterns=guard.blocked_patterns)
    raise ToolDefinitionError(f"guard must be an InputGuard, got {guard!r}")


def tool_defaults(
    *, guard: InputGuard | None = None, idempotent: IdempotencyDeclaration = None
) -> Callable[[_C], _C]:
    """Class decorator: defaults for the ``@tool`` methods of a toolkit class.

    A method's own ``guard``/``idempotent`` wins; otherwise the nearest class in the MRO with
    ``@tool_defaults`` decides, then the module's ``TOOLTRAIL_DEFAULTS``. Register the tools of
    an *instance* (``registry.register_toolkit(kit)`` or ``registry.register(kit.method)``).
    """
    defaults = ToolDefaults(guard=guard, idempotent=idempotent)

    def decorate(cls: _C) -> _C:
        if not isinstance(cls, type):
            raise TypeError(f"@tool_defaults decorates a class, not {cls!r}")
        setattr(cls, DEFAULTS_ATTRIBUTE, defaults)
        return cls

    return decorate


def class_defaults(owner: type | None) -> Iterator[ToolDefaults]:
    """The ``@tool_defaults`` along ``owner``'s MRO, nearest class first."""
    if owner is None:
        return
    for klass in owner.__mro__:
        found = vars(klass).get(DEFAULTS_ATTRIBUTE)
        if isinstance(found, ToolDefaults):
            yield found


def inherited_default(
    attribute: Literal["guard", "idempotent"],
    owner: type | None,
    namespace: Mapping[str, Any] | None,
) -> Any:
    """The nearest non-``None`` default of ``attribute``: classes along the MRO, then module.

    Each attribute resolves on its own: a subclass's ``@tool_defaults(idempotent=False)``
    leaves the guard of its base's ``@tool_defaults`` in force.

    Raises:
        ToolDefinitionError: the module's ``TOOLTRAIL_DEFAULTS`` is not a ``ToolDefaults``.
    """
    for defaults in class_defaults(owner):
        value = getattr(defaults, attribute)
        if value is not None:
            return value
    module = module_defaults(namespace)
    return None if module is None else getattr(module, attribute)


def module_defaults(namespace: Mapping[str, Any] | None) -> ToolDefaults | None:
    """The ``TOOLTRAIL_DEFAULTS`` of a module namespace (a function's ``__globals__``).

    Raises:
        ToolDefinitionError: the name is bound to something other than ``ToolDefaults``.
    """
    if namespace is None:
        return None
    found = namespace.get(MODULE_DEFAULTS_NAME)
    if found is None or isinstance(found, ToolDefaults):
        return found
    module = namespace.get("__name__", "?")
    raise ToolDefinitionError(
        f"{MODULE_DEFAULTS_NAME} of module {module!r} must be a ToolDefaults, got {found!r}"
    )


def readonly_view(value: Any) -> Any:
    """Return a deeply read-only copy of JSON-like data.

    Mappings become ``MappingProxyType`` over fresh dicts, lists and tuples become tuples,
    sets become frozensets; other values are deep-copied. Nothing reachable from the result
    aliases ``value``.
    """
    if isinstance(value, Mapping):
        return MappingProxyType({key: readonly_view(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(readonly_view(item) for item in value)
    if isinstance(value, set | frozenset):
        return frozenset(readonly_view(item) for item in value)
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    return copy.deepcopy(value)
