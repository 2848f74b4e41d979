"""A static tool: ``Tool``, a function plus its parameter model and dispatch declarations.

The model is generated from the function's type hints; ``validate`` runs the guardrail
pipeline of spec §4.2 on a call's arguments and ``invoke`` runs the body on deep copies of
the snapshot it returned.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import re
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo
from temporalio import activity

from tooltrail.errors import ToolDefinitionError
from tooltrail.tools._catalog import ToolSpec, _docstring_parts, _strip_titles
from tooltrail.tools._context import ToolContext
from tooltrail.tools._guard_plumbing import (
    _NO_LIMITS,
    _model_plan,
    _scan_model,
    _scan_raw,
    _validator_items,
)
from tooltrail.tools._rejections import ArgumentsRejected, _validation_items
from tooltrail.tools._snapshot import Snapshot, canonical_json
from tooltrail.tools.body_lanes import run_async_body, run_sync_body
from tooltrail.tools.guards import (
    Guard,
    InputGuard,
    Limits,
    as_input_guard,
    inherited_default,
    readonly_view,
)
from tooltrail.tools.idempotency import Idempotency, IdempotencyDeclaration

__all__ = ["Tool"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _is_method(fn: Callable[..., Any], params: list[inspect.Parameter]) -> bool:
    """Whether ``fn`` is a function defined in a class body with an unannotated ``self``."""
    if not params or params[0].name != "self" or params[0].annotation is not params[0].empty:
        return False
    parts = getattr(fn, "__qualname__", "").split(".")
    return len(parts) >= 2 and parts[-2] != "<locals>"


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


def _in_worker_activity() -> bool:
    # Inside a (non-local) activity: the body shares the worker's event loop with every
    # heartbeat and workflow task. A local activity's body stays (its timeout bounds it).
    try:
        return not activity.info().is_local
    except RuntimeError:
        return False
