"""Idempotency keys: ``derive_key`` and the canonical snapshot text it hashes.

A key is ``sha256`` of the canonical JSON of ``KEY_VERSION``, the tool name, the scope and
the key material (the effective snapshot, or an explicit key function's result).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel

from tooltrail.core.text import canonical_json
from tooltrail.tools.idempotency._errors import IdempotencyKeyError
from tooltrail.tools.idempotency._policy import Idempotency, resolve_idempotency

__all__ = ["KEY_VERSION", "canonical_snapshot_text", "derive_key"]

KEY_VERSION = "tooltrail-idem/1"
"""The first element of the hashed key material; bump it to invalidate every stored key."""


def _model_of(snapshot_or_model: Any) -> BaseModel:
    if isinstance(snapshot_or_model, BaseModel):
        return snapshot_or_model
    model = getattr(snapshot_or_model, "model", None)
    if isinstance(model, BaseModel):
        return model
    raise TypeError(
        "expected a pydantic model or a snapshot with a .model attribute, "
        f"got {type(snapshot_or_model).__name__!r}"
    )


def canonical_snapshot_text(model: BaseModel) -> str:
    """Return the canonical JSON text of a materialized model (spec §4.3), decoded.

    Raises:
        ValueError: the model holds a non-finite float.
    """
    return canonical_json(model.model_dump(mode="json"))


def derive_key(
    tool_name: Any,
    snapshot_or_model: Any,
    principal: Any = None,
    *,
    policy: Idempotency | None = None,
    principal_id: str | None = None,
) -> str:
    """Return the idempotency key of a call (spec §5.2): 64 lowercase hex digits.

    ``sha256(canonical_json([KEY_VERSION, tool_name, scope_id, material]))`` where
    ``scope_id`` is ``principal_id`` (``None`` for ``scope="global"``) and ``material`` is
    the snapshot's canonical JSON text (``hash_input``) or ``policy.key(model)``
    (``explicit``).

    Args:
        tool_name: the registered tool name.
        snapshot_or_model: the materialized pydantic model, or a snapshot with ``.model``.
        principal: with a ``Tool``, the ``Principal`` (or its id) whose scope the key is in.
        policy: the tool's policy; its strategy must not be ``"none"``.
        principal_id: the configured principal's id, or ``None`` when there is none.

    The spec's form (§5.2) also works: ``derive_key(tool, arguments, principal=None)`` with
    a registered ``Tool`` and raw arguments runs the guardrails' steps 3a-3d (no side
    effects) and uses the tool's own policy, giving exactly the key dispatch would use.

    Raises:
        IdempotencyKeyError: the explicit key function raised or returned anything but a
            non-empty ``str``.
        ValueError: the policy's strategy is ``"none"`` (or the tool is not idempotent), or
            the snapshot holds inf/NaN.
        TypeError: ``snapshot_or_model`` is neither a model nor a snapshot.
    """
    if not isinstance(tool_name, str):
        # The spec's form: a Tool, its raw arguments, and the principal.
        tool = tool_name
        resolved = resolve_idempotency(tool.idempotent)
        if resolved is None or resolved.strategy == "none":
            raise ValueError(f"tool {tool.name!r} is not idempotent: it has no key")
        snapshot = tool.validate(dict(snapshot_or_model or {}))
        principal_of = getattr(principal, "id", principal)
        return derive_key(tool.name, snapshot, policy=resolved, principal_id=principal_of)
    if policy is None:
        raise TypeError("derive_key(tool_name, snapshot, ...) needs policy=")
    model = _model_of(snapshot_or_model)
    canonical = getattr(snapshot_or_model, "canonical", None)
    if policy.strategy == "hash_input":
        # The snapshot's bytes were computed once when the arguments were frozen (spec §4.3).
        material = (
            canonical.decode("utf-8")
            if isinstance(canonical, bytes)
            else canonical_snapshot_text(model)
        )
    elif policy.strategy == "explicit":
        material = _explicit_material(tool_name, model, policy)
    else:
        raise ValueError(f"tool {tool_name!r} is not idempotent (strategy 'none'): it has no key")
    scope_id = principal_id if policy.scope == "principal" else None
    text = canonical_json([KEY_VERSION, tool_name, scope_id, material])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _explicit_material(tool_name: str, model: BaseModel, policy: Idempotency) -> str:
    if policy.key is None:
        raise IdempotencyKeyError(f"tool {tool_name!r}: strategy 'explicit' has no key function")
    try:
        # A deep copy: a key function that mutates nested values cannot alter the snapshot.
        material: object = policy.key(model.model_copy(deep=True))
    except Exception as exc:
        raise IdempotencyKeyError(
            f"the idempotency key function of tool {tool_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(material, str) or not material:
        raise IdempotencyKeyError(
            f"the idempotency key function of tool {tool_name!r} must return a non-empty str, "
            f"got {material!r}"
        )
    return material
