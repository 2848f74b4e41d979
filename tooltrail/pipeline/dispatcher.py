"""The tool dispatcher (guardrails spec §2): one call from a resolved name to its outcome.

Steps, each only if the previous one let the call through: resolve the name, the access
gate on the raw arguments, the guardrails (static tools), the idempotency claim (static,
idempotent tools), the body, and the audit row. A call stopped at step *n* has no effect of a
later step. Inside a turn this is the registry core of the tool activity (wrapped by the
middleware pipeline); used on its own it is the spec's ``ToolDispatcher``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict
from pydantic_core import to_jsonable_python

from tooltrail.core.results import ToolOutput
from tooltrail.tools import (
    ArgumentsRejected,
    Tool,
    ToolContext,
    ToolRegistry,
    UnknownToolError,
    to_output,
)
from tooltrail.tools.access import AccessConfig, AccessController, AccessDecision
from tooltrail.tools.idempotency import (
    CachedToolError,
    IdempotencyKeyError,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    derive_key,
    resolve_idempotency,
    run_idempotent,
)
from tooltrail.tools.scratch import ScratchDirs

__all__ = [
    "AuditLog",
    "DispatchRecord",
    "DispatchResult",
    "DispatchStatus",
    "InMemoryAuditLog",
    "NullAuditLog",
    "ToolDispatcher",
    "dispatch_record_of",
]

log = logging.getLogger("tooltrail.dispatcher")

DispatchStatus = Literal[
    "ok", "tool_error", "cache_hit", "guardrail_violation", "access_denied", "idempotency_busy"
]


class DispatchResult(BaseModel):
    """The outcome of one dispatch; soft errors have ``is_error=True`` and a ``text``."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    status: DispatchStatus
    is_error: bool
    value: Any = None
    """The JSON-normalized return value (``ok`` and ``cache_hit``)."""
    text: str | None = None
    """The model-facing text of a soft error."""
    idempotency_key: str | None = None
    source_call_id: str | None = None
    """For a ``cache_hit``: the call whose body produced the value."""
    output: ToolOutput | None = None
    """The value as a tool output (what the model reads), for the pipeline."""
    record: DispatchRecord | None = None
    """The audit record this dispatch wrote."""


class DispatchRecord(BaseModel):
    """The audit fields this layer contributes to an attempt's events (spec §8)."""

    call_id: str
    attempt: int
    tool_name: str
    tool_kind: str
    principal_id: str | None
    raw_arguments: dict[str, Any]
    ignored_arguments: list[str] = []
    effective_arguments: str | None = None
    idempotency_key: str | None = None
    status: DispatchStatus
    text: str | None = None
    value: Any = None
    source_call_id: str | None = None
    lease_lost: bool = False
    started_at: datetime
    finished_at: datetime


class AuditLog(Protocol):
    """Where dispatch records go."""

    async def write(self, record: DispatchRecord) -> None:
        """Store one record."""
        ...


class NullAuditLog:
    """Keeps nothing: each record travels with its dispatch's result instead (workers).

    A worker's tool activity returns the record with the attempt's outcome and the workflow
    writes it into the turn's SQL trail (spec §8); keeping a copy in memory too would only
    grow with every call. A dispatch that raises carries its record on the exception
    (``dispatch_record_of``).
    """

    async def write(self, record: DispatchRecord) -> None:
        """Drop the record (it travels with the result)."""


_RECORD_ATTRIBUTE = "_tooltrail_dispatch_record"


def dispatch_record_of(exc: BaseException) -> DispatchRecord | None:
    """The dispatch record of a dispatch that raised ``exc`` (or raised what caused it)."""
    seen: BaseException | None = exc
    for _ in range(3):  # the exception itself, or what a timeout or wrapper raised from it
        if seen is None:
            return None
        record = getattr(seen, _RECORD_ATTRIBUTE, None)
        if isinstance(record, DispatchRecord):
            return record
        seen = seen.__cause__ or seen.__context__
    return None


def _attach(exc: BaseException, record: DispatchRecord | None) -> None:
    # The record of a dispatch that raises still reaches the trail: it rides on the
    # exception (exactly one row per dispatch past step 1, whatever the outcome: spec §8).
    with contextlib.suppress(AttributeError, TypeError):  # an exception type with __slots__
        setattr(exc, _RECORD_ATTRIBUTE, record)


class InMemoryAuditLog:
    """Records kept in a list (unit tests, and the activity, which returns them instead)."""

    def __init__(self) -> None:
        """Start empty."""
        self.rows: list[DispatchRecord] = []

    async def write(self, record: DispatchRecord) -> None:
        """Append the record."""
        self.rows.append(record)


def _raw_input(arguments: Any) -> Any:
    # Step 0: None means {}; anything else is passed on as given (3a rejects a non-mapping).
    return {} if arguments is None else arguments


def _mapping_of(given: Any) -> dict[str, Any]:
    # What the gate and the audit row see: a non-mapping (rejected at 3a) shows as {}.
    return dict(given) if isinstance(given, Mapping) else {}


def _principal_id(access: AccessController) -> str | None:
    principal = access.principal
    return None if principal is None else principal.id


class ToolDispatcher:
    """Dispatches calls to a registry through the access gate, guardrails and idempotency."""

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        store: IdempotencyStore | None = None,
        audit: AuditLog | None = None,
        access: AccessConfig | None = None,
        clock: Callable[[], datetime] | None = None,
        scratch: ScratchDirs | None = None,
    ) -> None:
        """Create a dispatcher.

        Args:
            registry: the tools.
            store: the idempotency store (default: a fresh in-memory store of its own).
            audit: where dispatch records go (default: a fresh in-memory log).
            access: the access gate's configuration; ``None`` installs no gate.
            clock: the clock of the audit timestamps.
            scratch: session scratch directories for contexts built here.

        Raises:
            TypeError: ``registry`` is ``None``.
        """
        if registry is None:
            raise TypeError("ToolDispatcher needs a ToolRegistry")
        self.registry = registry
        self.idempotency_store: IdempotencyStore = (
            store if store is not None else InMemoryIdempotencyStore()
        )
        self.audit: AuditLog = audit if audit is not None else InMemoryAuditLog()
        self.access = AccessController(access)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._scratch = scratch or ScratchDirs()

    def lookup(self, name: str) -> Tool | None:
        """Return the tool called ``name``, or ``None``; runs nothing."""
        return self.registry.lookup(name)

    def configure_access(self, **changes: Any) -> AccessConfig | None:
        """Change the access configuration until the worker freezes it."""
        return self.access.configure(**changes)

    def freeze(self) -> None:
        """Freeze the registry and the access configuration (``build_worker`` calls this)."""
        self.registry.freeze()
        self.access.freeze()

    async def authorize_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None
    ) -> AccessDecision:
        """Preflight: would dispatch get past the access gate? Runs nothing, writes nothing.

        Raises:
            UnknownToolError: the name is not registered (exactly like dispatch).
        """
        found = self.registry.lookup(name)
        if found is None:
            raise UnknownToolError(name)
        return await self.access.check(name, found.kind, _mapping_of(_raw_input(arguments)))

    async def dispatch(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        call_id: str,
        attempt: int = 1,
        ctx: ToolContext | None = None,
        heartbeat: Callable[[], None] | None = None,
        fence: str | None = None,
    ) -> DispatchResult:
        """Run one call through the steps of spec §2.

        Args:
            name: the tool name (exact, case-sensitive).
            arguments: the raw arguments (``None`` means ``{}``).
            call_id: the model's tool-call id.
            attempt: the Temporal activity attempt (1-based), part of the claim's owner.
            ctx: the tool context (default: one for a session named after the call).
            heartbeat: called while an idempotent call runs or waits (an activity heartbeat).
            fence: makes the idempotency claim's owner this execution's own
                (``tooltrail.tools.idempotency.owner_of``).

        Raises:
            UnknownToolError: the name is not registered.
            IdempotencyKeyError: an explicit key function failed (the body did not run).
            BaseException: whatever the body raised (the same instance), after the claim was
                completed or released and the audit row written.
        """
        started = self._clock()
        found = self.registry.lookup(name)
        if found is None:
            raise UnknownToolError(name)
        # Anything but a mapping is rejected at 3a (after the gate), never coerced to one.
        given = _raw_input(arguments)
        raw = _mapping_of(given)
        principal_id = _principal_id(self.access)
        record = _Record(self, found, call_id, attempt, principal_id, raw, started)

        # The gate sees exactly what preflight (authorize_tool) gives it.
        decision = await self.access.check(name, found.kind, raw)
        if not decision.allowed:
            return await record.soft("access_denied", decision.error_text)
        try:
            snapshot = found.validate(raw if isinstance(given, Mapping) else given)
        except ArgumentsRejected as rejected:
            record.ignored = list(getattr(rejected, "ignored_arguments", ()))
            return await record.soft("guardrail_violation", str(rejected))
        record.ignored = list(snapshot.ignored_arguments)
        record.effective = snapshot.effective_arguments
        policy = resolve_idempotency(found.idempotent) if found.kind == "static" else None
        if policy is not None and policy.strategy == "none":
            policy = None
        key = None
        if policy is not None:
            try:
                key = derive_key(name, snapshot, policy=policy, principal_id=principal_id)
            except IdempotencyKeyError as exc:
                # Spec §5.2/§7: raised, not soft (the turn's core makes it a soft tool
                # error); the body does not run, the store is untouched, one audit row.
                await record.write("tool_error", text=f"{type(exc).__name__}: {exc}")
                _attach(exc, record.last)
                raise
        context = ctx or ToolContext(
            session_id=call_id,
            turn_id="",
            tool_call_id=call_id,
            attempt=max(0, attempt - 1),
            temp_dir=self._scratch.ensure(call_id),
        )
        context = replace(context, principal=self.access.principal, idempotency_key=key)

        async def body() -> Any:
            return await found.invoke(context, snapshot)

        if policy is None or key is None:
            try:
                value = await body()
            except BaseException as exc:
                await record.write("tool_error", text=f"{type(exc).__name__}: {exc}")
                _attach(exc, record.last)
                raise
            return await record.done("ok", value)
        record.key = key
        attempt_index = context.attempt

        def audit_row(_value: Any) -> dict[str, Any]:
            # Spec §5.5: this attempt's audit row commits with the completion (in the same
            # row), so a worker lost right after it leaves the row for the retry to report.
            # The value is the outcome's own: stored once, put back on adoption.
            row = record.build("ok")
            return {"attempt_index": attempt_index, "record": row.model_dump(mode="json")}

        try:
            outcome = await run_idempotent(
                self.idempotency_store,
                key=key,
                policy=policy,
                tool_name=name,
                call_id=call_id,
                attempt=attempt,
                body=lambda: _normalized(body),
                heartbeat=heartbeat,
                fence=fence,
                # The key's scope, kept in the record so an operator can tell whose it is.
                scope_principal=principal_id if policy.scope == "principal" else None,
                audit_row=audit_row,
            )
        except CachedToolError as cached:
            await record.write("tool_error", text=str(cached), source=cached.source_call_id)
            _attach(cached, record.last)
            raise
        except BaseException as exc:
            await record.write("tool_error", text=f"{type(exc).__name__}: {exc}")
            _attach(exc, record.last)
            raise
        if outcome.status == "idempotency_busy":
            return await record.soft("idempotency_busy", outcome.text or "")
        stored = outcome.audit
        if (
            outcome.status == "cache_hit"
            and stored is not None
            and outcome.source_call_id == call_id
            and stored.get("attempt_index") == attempt_index
        ):
            # A Temporal retry of the attempt whose body ran (its worker was lost after the
            # completion committed): the same attempt (pipeline spec §0), so its one row
            # is the one stored with the completion, not a cache hit.
            return await record.adopt(DispatchRecord.model_validate(stored["record"]), outcome)
        record.lease_lost = outcome.lease_lost
        return await record.done(
            outcome.status, _restore(outcome.value), source=outcome.source_call_id
        )


async def _normalized(body: Callable[[], Any]) -> Any:
    # Stored values must cross the activity boundary and compare equal on a hit: store the
    # tool output's JSON form, so a ToolOutput survives the round trip.
    value = await body()
    if isinstance(value, ToolOutput):
        return {"__tooltrail_output__": value.model_dump(mode="json")}
    return to_jsonable_python(value)


def _jsonable(value: Any) -> Any:
    # The value as the audit row and the result carry it.
    if isinstance(value, ToolOutput):
        return value.model_dump(mode="json")
    return to_jsonable_python(value, fallback=str)


def _restore(value: Any) -> Any:
    if isinstance(value, dict) and "__tooltrail_output__" in value:
        return ToolOutput.model_validate(value["__tooltrail_output__"])
    return value


class _Record:
    """Builds the one audit record of a dispatch that passed step 1."""

    def __init__(
        self,
        dispatcher: ToolDispatcher,
        tool: Tool,
        call_id: str,
        attempt: int,
        principal_id: str | None,
        raw: dict[str, Any],
        started: datetime,
    ) -> None:
        self.dispatcher = dispatcher
        self.tool = tool
        self.call_id = call_id
        self.attempt = attempt
        self.principal_id = principal_id
        self.raw = copy.deepcopy(raw)
        self.started = started
        self.ignored: list[str] = []
        self.effective: str | None = None
        self.key: str | None = None
        self.lease_lost = False
        self.last: DispatchRecord | None = None

    async def write(
        self,
        status: DispatchStatus,
        *,
        text: str | None = None,
        value: Any = None,
        source: str | None = None,
    ) -> None:
        record = self.build(status, text=text, value=value, source=source)
        await self.dispatcher.audit.write(record)
        self.last = record

    def build(
        self,
        status: DispatchStatus,
        *,
        text: str | None = None,
        value: Any = None,
        source: str | None = None,
    ) -> DispatchRecord:
        return DispatchRecord(
            call_id=self.call_id,
            attempt=self.attempt,
            tool_name=self.tool.name,
            tool_kind=self.tool.kind,
            principal_id=self.principal_id,
            raw_arguments=self.raw,
            ignored_arguments=self.ignored,
            effective_arguments=self.effective,
            idempotency_key=self.key,
            status=status,
            text=text,
            value=to_jsonable_python(value, fallback=str),
            source_call_id=source,
            lease_lost=self.lease_lost,
            started_at=self.started,
            finished_at=self.dispatcher._clock(),
        )

    async def adopt(self, stored: DispatchRecord, outcome: Any) -> DispatchResult:
        """Report the row an earlier Temporal attempt of this attempt stored (spec §5.5)."""
        value = _restore(outcome.value)
        stored = stored.model_copy(update={"value": _jsonable(value)})
        await self.dispatcher.audit.write(stored)
        self.last = stored
        return DispatchResult(
            status=stored.status,
            is_error=to_output(value).is_error,
            value=_jsonable(value),
            idempotency_key=self.key,
            output=to_output(value),
            record=stored,
        )

    async def soft(self, status: DispatchStatus, text: str) -> DispatchResult:
        await self.write(status, text=text)
        return DispatchResult(
            status=status,
            is_error=True,
            text=text,
            idempotency_key=self.key,
            output=ToolOutput(text=text, is_error=True),
            record=self.last,
        )

    async def done(
        self, status: DispatchStatus, value: Any, *, source: str | None = None
    ) -> DispatchResult:
        output = to_output(value)
        jsonable = _jsonable(value)
        await self.write(status, value=jsonable, source=source)
        return DispatchResult(
            status=status,
            is_error=output.is_error,
            value=jsonable,
            idempotency_key=self.key,
            source_call_id=source,
            output=output,
            record=self.last,
        )


DispatchResult.model_rebuild()
