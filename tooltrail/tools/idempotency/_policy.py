"""The idempotency policy: ``Idempotency``, what a tool may declare, and its effective policy.

``IdempotencyDeclaration`` is what ``@tool(idempotent=...)`` and the defaults accept;
``resolve_idempotency`` turns the nearest declaration into a policy, or ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from pydantic import BaseModel

from tooltrail.errors import ToolDefinitionError

__all__ = ["Idempotency", "IdempotencyDeclaration", "resolve_idempotency"]

_STRATEGIES = ("hash_input", "explicit", "none")
_SCOPES = ("principal", "global")


@dataclass(frozen=True)
class Idempotency:
    """How a tool's calls are deduplicated (spec §5.1).

    ``Idempotency()`` hashes the effective arguments and scopes the key to the principal.
    Check a policy with ``validate_for`` when the tool is registered.
    """

    strategy: Literal["hash_input", "explicit", "none"] = "hash_input"
    """``hash_input``: the key material is the snapshot; ``explicit``: ``key(model)``;
    ``none``: not idempotent (opts out of a class or module default)."""
    key: Callable[[BaseModel], str] | None = None
    """The key function of the ``explicit`` strategy; it receives the frozen model."""
    ttl_seconds: int = 3600
    """How long an outcome is served, from completion; hits do not extend it."""
    cache_failures: bool = False
    """Whether a failure is cached too (then hits raise ``CachedToolError``)."""
    scope: Literal["principal", "global"] = "principal"
    """``principal``: each principal has its own keys; ``global``: one key for everyone."""
    lease_seconds: float = 60.0
    """How long a claim lives without renewal; renewed every third of it while the body runs."""
    wait_timeout_seconds: float = 90.0
    """How long a call waits for another in-flight call with the same key."""

    def validate_for(self, tool_name: str) -> None:
        """Check the policy of the tool ``tool_name``; called at registration.

        Raises:
            ToolDefinitionError: ``explicit`` without ``key``, ``key`` with another strategy,
                ``ttl_seconds <= 0``, ``lease_seconds <= 0``,
                ``wait_timeout_seconds < lease_seconds``, or an unknown strategy or scope.
        """
        where = f"idempotency policy of tool {tool_name!r}"
        if self.strategy not in _STRATEGIES:
            raise ToolDefinitionError(
                f"{where}: unknown strategy {self.strategy!r}; use one of {', '.join(_STRATEGIES)}"
            )
        if self.scope not in _SCOPES:
            raise ToolDefinitionError(
                f"{where}: unknown scope {self.scope!r}; use 'principal' or 'global'"
            )
        if self.strategy == "explicit" and self.key is None:
            raise ToolDefinitionError(
                f"{where}: strategy 'explicit' needs a key function (key=lambda model: ...)"
            )
        if self.strategy != "explicit" and self.key is not None:
            raise ToolDefinitionError(
                f"{where}: a key function needs strategy='explicit', not {self.strategy!r}"
            )
        if self.key is not None and not callable(self.key):
            raise ToolDefinitionError(f"{where}: key must be callable")
        if isinstance(self.ttl_seconds, bool) or not isinstance(self.ttl_seconds, int):
            raise ToolDefinitionError(f"{where}: ttl_seconds must be an int")
        if self.ttl_seconds <= 0:
            raise ToolDefinitionError(f"{where}: ttl_seconds must be > 0, got {self.ttl_seconds}")
        if not math.isfinite(self.lease_seconds) or self.lease_seconds <= 0:
            raise ToolDefinitionError(
                f"{where}: lease_seconds must be > 0, got {self.lease_seconds}"
            )
        if not self.wait_timeout_seconds >= self.lease_seconds:
            raise ToolDefinitionError(
                f"{where}: wait_timeout_seconds ({self.wait_timeout_seconds}) must be >= "
                f"lease_seconds ({self.lease_seconds}), so a waiter outlives a dead owner's lease"
            )


IdempotencyDeclaration: TypeAlias = bool | Idempotency | None
"""What ``@tool(idempotent=...)``, ``@tool_defaults(idempotent=...)`` and
``ToolDefaults(idempotent=...)`` accept.

``True`` means ``Idempotency()``; ``False`` means not idempotent; a policy is used as given
(``strategy="none"``: not idempotent); ``None`` declares nothing at this level, so the next
one decides: a tool's ``None`` inherits its class's ``@tool_defaults``, then its module's
``TOOLTRAIL_DEFAULTS``, and when nobody declares anything the tool is not idempotent.
"""


def resolve_idempotency(value: IdempotencyDeclaration) -> Idempotency | None:
    """Return the effective policy of a declaration, or ``None`` when the store is not used.

    ``True`` means ``Idempotency()``; ``False``, ``None`` (nothing declared anywhere) and a
    policy with ``strategy="none"`` mean "not idempotent". Apply it to the *nearest*
    declaration (method, then class, then module): it replaces the others wholesale. It does
    not validate; call ``Idempotency.validate_for`` at registration.

    Raises:
        ToolDefinitionError: ``value`` is neither a bool, an ``Idempotency`` nor ``None``.
    """
    if value is None or value is False:
        return None
    if value is True:
        return Idempotency()
    if isinstance(value, Idempotency):
        return None if value.strategy == "none" else value
    raise ToolDefinitionError(
        f"idempotent must be True, False or an Idempotency(...) policy, got {value!r}"
    )
