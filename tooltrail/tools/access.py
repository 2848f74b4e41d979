"""The access gate (spec §6): may this principal run this tool with these arguments?

Identity is host configuration, fixed when the worker is built (``AccessConfig``); it is never
read from workflow input, tool-call arguments or anything else a model or user can write. A
host without an ``AccessConfig`` runs without a gate. Once a gate is installed it fails
closed: a missing principal denies every call without consulting the gate, and a gate that
raises denies the call (the exception is logged, never propagated).

The gate sees the **raw** arguments, as a deeply read-only view: preflight
(``authorize_tool``) runs no guardrails, yet must predict what dispatch decides.

Gates are side-effect free: no writes, tool calls or store access. The default
``ScopeGate`` matches tool names against the authority's ``fnmatch`` patterns, deny first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal, Protocol, runtime_checkable

from tooltrail.errors import TooltrailError
from tooltrail.tools.guards import readonly_view

__all__ = [
    "NO_GATE_REASON",
    "NO_PRINCIPAL_REASON",
    "AccessConfig",
    "AccessConfigFrozenError",
    "AccessController",
    "AccessDecision",
    "AccessGate",
    "AccessRequest",
    "AuthorityScope",
    "Principal",
    "ScopeGate",
    "Subject",
    "authorize",
]

log = logging.getLogger("tooltrail.access")

NO_PRINCIPAL_REASON = "no principal configured"
"""Why every call is denied when an ``AccessConfig`` has no principal."""

NO_GATE_REASON = "no access gate configured"
"""The reason of the allow decision given when no ``AccessConfig`` is installed."""

ToolKind = Literal["static", "dynamic"]


class AccessConfigFrozenError(TooltrailError):
    """Raised by ``configure`` once the worker has frozen the access configuration."""


def _identity(value: object, kind: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} id must be a non-empty str, got {value!r}")
    return value


@dataclass(frozen=True)
class Principal:
    """On whose behalf the worker acts (for example a service account)."""

    id: str
    """The principal's id; it scopes idempotency keys and appears in audit rows."""

    def __post_init__(self) -> None:
        _identity(self.id, "principal")


@dataclass(frozen=True)
class Subject:
    """Which agent acts (informational; the default gate ignores it)."""

    id: str
    """The agent's id."""

    def __post_init__(self) -> None:
        _identity(self.id, "subject")


def _patterns(value: Iterable[str] | str, name: str) -> frozenset[str]:
    # A lone string is one pattern, not a set of one-character patterns.
    items = (value,) if isinstance(value, str) else tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"AuthorityScope.{name} holds {item!r}, not a str pattern")
    return frozenset(items)


@dataclass(frozen=True)
class AuthorityScope:
    """Which tools a principal may use: ``fnmatch`` patterns (``"search_*"``), deny first.

    An empty ``allowed_tools`` allows nothing; ``AuthorityScope.all()`` allows everything.
    Matching is case-sensitive (``fnmatchcase``).
    """

    allowed_tools: AbstractSet[str] = frozenset()
    """Patterns of the tools allowed."""
    denied_tools: AbstractSet[str] = frozenset()
    """Patterns of the tools denied even when allowed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_tools", _patterns(self.allowed_tools, "allowed_tools"))
        object.__setattr__(self, "denied_tools", _patterns(self.denied_tools, "denied_tools"))

    @classmethod
    def all(cls) -> AuthorityScope:
        """Every tool: ``allowed_tools={"*"}``."""
        return cls(allowed_tools=frozenset({"*"}))

    def denies(self, tool_name: str) -> bool:
        """Whether a ``denied_tools`` pattern matches ``tool_name``."""
        return any(fnmatchcase(tool_name, pattern) for pattern in sorted(self.denied_tools))

    def allows(self, tool_name: str) -> bool:
        """Whether an ``allowed_tools`` pattern matches ``tool_name`` (ignoring denials)."""
        return any(fnmatchcase(tool_name, pattern) for pattern in sorted(self.allowed_tools))


@dataclass(frozen=True)
class AccessRequest:
    """What a gate decides on."""

    principal: Principal
    """The configured principal."""
    authority: AuthorityScope
    """The configured authority."""
    subject: Subject | None
    """The configured subject, if any."""
    tool_name: str
    """The resolved tool name."""
    tool_kind: ToolKind
    """``"static"`` or ``"dynamic"``."""
    arguments: Mapping[str, Any] = field(default_factory=lambda: readonly_view({}))
    """A deeply read-only view of the raw arguments (``None`` became ``{}``)."""


@dataclass(frozen=True)
class AccessDecision:
    """A gate's answer."""

    allowed: bool
    """Whether the call may go on."""
    reason: str = ""
    """Why; the model reads it after ``access denied: `` when denied."""

    @property
    def error_text(self) -> str:
        """The soft error text of a denial: ``access denied: <reason>``."""
        return f"access denied: {self.reason}"

    @classmethod
    def allow(cls, reason: str = "") -> AccessDecision:
        """An allow decision."""
        return cls(True, reason)

    @classmethod
    def deny(cls, reason: str) -> AccessDecision:
        """A denial."""
        return cls(False, reason)


@runtime_checkable
class AccessGate(Protocol):
    """Decides whether a call may run; MUST be side-effect free."""

    async def check(self, request: AccessRequest) -> AccessDecision:
        """Return the decision for ``request``."""
        ...


class ScopeGate:
    """The default gate: the authority's patterns, deny before allow.

    1. a ``denied_tools`` match: ``tool '<name>' is denied for principal '<id>'``;
    2. an ``allowed_tools`` match: allowed;
    3. otherwise: ``tool '<name>' is outside the authority of principal '<id>'``.
    """

    async def check(self, request: AccessRequest) -> AccessDecision:
        """Return the decision for ``request``."""
        name, principal = request.tool_name, request.principal.id
        if request.authority.denies(name):
            return AccessDecision.deny(f"tool '{name}' is denied for principal '{principal}'")
        if request.authority.allows(name):
            return AccessDecision.allow(
                f"tool '{name}' is within the authority of principal '{principal}'"
            )
        return AccessDecision.deny(
            f"tool '{name}' is outside the authority of principal '{principal}'"
        )

    def __repr__(self) -> str:
        return "ScopeGate()"

    def __eq__(self, other: object) -> bool:
        return type(other) is ScopeGate

    def __hash__(self) -> int:
        return hash(ScopeGate)


@dataclass(frozen=True, init=False)
class AccessConfig:
    """The worker's identity and gate: host configuration, never request data.

    ``AccessConfig(principal, authority, subject=None, gate=ScopeGate())``. ``principal`` is
    required; ``None`` is allowed only to fail closed (every call is then denied with
    ``no principal configured``). A ``str`` principal or subject is wrapped in
    ``Principal``/``Subject``. ``authority`` defaults to an empty scope, which allows nothing.
    """

    principal: Principal | None
    """On whose behalf the worker acts."""
    authority: AuthorityScope
    """Which tools it may use."""
    subject: Subject | None
    """Which agent acts."""
    gate: AccessGate
    """The gate; the default ``ScopeGate`` checks ``authority``."""

    def __init__(
        self,
        principal: Principal | str | None,
        authority: AuthorityScope | None = None,
        subject: Subject | str | None = None,
        gate: AccessGate | None = None,
    ) -> None:
        """Create the configuration.

        Raises:
            TypeError: a part has the wrong type (a gate needs an async ``check``).
            ValueError: an id is empty.
        """
        if isinstance(principal, str):
            principal = Principal(principal)
        elif principal is not None and not isinstance(principal, Principal):
            raise TypeError(f"principal must be a Principal or None, got {principal!r}")
        if isinstance(subject, str):
            subject = Subject(subject)
        elif subject is not None and not isinstance(subject, Subject):
            raise TypeError(f"subject must be a Subject or None, got {subject!r}")
        if authority is None:
            authority = AuthorityScope()
        elif not isinstance(authority, AuthorityScope):
            raise TypeError(f"authority must be an AuthorityScope, got {authority!r}")
        if gate is None:
            gate = ScopeGate()
        elif not callable(getattr(gate, "check", None)):
            raise TypeError(f"gate must have an async check(request) method, got {gate!r}")
        object.__setattr__(self, "principal", principal)
        object.__setattr__(self, "authority", authority)
        object.__setattr__(self, "subject", subject)
        object.__setattr__(self, "gate", gate)

    @classmethod
    def allow_all(
        cls, principal: Principal | str, *, subject: Subject | str | None = None
    ) -> AccessConfig:
        """A configuration whose authority is every tool (``AuthorityScope.all()``)."""
        return cls(principal, AuthorityScope.all(), subject)


async def authorize(
    access: AccessConfig | None,
    tool_name: str,
    tool_kind: ToolKind,
    arguments: Mapping[str, Any] | None,
) -> AccessDecision:
    """Ask the configured gate about one call (step 2 of dispatch, and preflight).

    Args:
        access: the host's configuration; ``None`` means no gate: always allowed.
        tool_name: the resolved tool name.
        tool_kind: ``"static"`` or ``"dynamic"``.
        arguments: the raw arguments (``None`` means ``{}``); the gate gets a deeply
            read-only copy, so nothing it does can change them.

    Returns:
        The decision. It never raises for a gate failure: that is a denial with reason
        ``gate error (<ExceptionType>)``.
    """
    if access is None:
        return AccessDecision.allow(NO_GATE_REASON)
    if access.principal is None:
        return AccessDecision.deny(NO_PRINCIPAL_REASON)
    request = AccessRequest(
        principal=access.principal,
        authority=access.authority,
        subject=access.subject,
        tool_name=tool_name,
        tool_kind=tool_kind,
        arguments=readonly_view({} if arguments is None else arguments),
    )
    try:
        decision = await access.gate.check(request)
    except Exception as exc:
        log.warning("access gate %r raised for tool %r", access.gate, tool_name, exc_info=True)
        return AccessDecision.deny(f"gate error ({type(exc).__name__})")
    if not isinstance(decision, AccessDecision):
        log.warning("access gate %r returned %r, not an AccessDecision", access.gate, decision)
        return AccessDecision.deny("gate error (TypeError)")
    return decision


_UNSET: Any = object()


class AccessController:
    """The worker's single access handle: dispatch, preflight and activities share it.

    It holds the configuration, lets the host change any part of it until the worker
    freezes it, and asks the gate.
    """

    def __init__(self, config: AccessConfig | None = None) -> None:
        """Install ``config`` (``None``: no gate)."""
        self._config = config
        self._frozen = False

    @property
    def config(self) -> AccessConfig | None:
        """The current configuration."""
        return self._config

    @property
    def principal(self) -> Principal | None:
        """The configured principal (``None`` without configuration)."""
        return None if self._config is None else self._config.principal

    @property
    def frozen(self) -> bool:
        """Whether ``configure`` is refused."""
        return self._frozen

    def freeze(self) -> None:
        """Refuse further ``configure`` calls (the worker calls this when it is built)."""
        self._frozen = True

    def configure(
        self,
        *,
        principal: Principal | str | None = _UNSET,
        authority: AuthorityScope = _UNSET,
        subject: Subject | str | None = _UNSET,
        gate: AccessGate = _UNSET,
    ) -> AccessConfig:
        """Set any subset of the configuration; the rest is kept.

        Without a configuration yet, this installs one (authority defaults to none).

        Raises:
            AccessConfigFrozenError: the worker has frozen the configuration.
        """
        if self._frozen:
            raise AccessConfigFrozenError(
                "the access configuration is frozen: a worker was built with it; "
                "configure access before building the worker"
            )
        current = self._config or AccessConfig(principal=None)
        self._config = AccessConfig(
            principal=current.principal if principal is _UNSET else principal,
            authority=current.authority if authority is _UNSET else authority,
            subject=current.subject if subject is _UNSET else subject,
            gate=current.gate if gate is _UNSET else gate,
        )
        return self._config

    async def check(
        self, tool_name: str, tool_kind: ToolKind, arguments: Mapping[str, Any] | None
    ) -> AccessDecision:
        """The decision for one call; see ``authorize``."""
        return await authorize(self._config, tool_name, tool_kind, arguments)
