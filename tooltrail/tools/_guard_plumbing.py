"""Guard plumbing: the limits a parameter model's fields carry, and the walks that apply them.

Each field's limits come from its ``Guard`` metadata (nested ones included); the walks check
raw and materialized values against them, and a failing guard validator becomes items of
the guardrail text.
"""

from __future__ import annotations

import functools
import logging
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel, ValidationError

from tooltrail.tools._rejections import _validation_items
from tooltrail.tools.guards import Guard, GuardrailViolation, Limits

log = logging.getLogger("tooltrail.tools")

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
