"""The wire format's compaction, in one place: what the envelopes leave unsaid.

Every byte of a workflow's or activity's input and output is stored in the workflow
history, once per tool call or turn. So the envelopes that cross Temporal that often travel
without what the other side already knows, and get it back on arrival:

- **Defaults** (``pack``/``unpack``, applied by tooltrail's data converter,
  ``tooltrail.runtime.converter``): a field of an envelope (``ENVELOPES``) that holds its plain
  default (``None``, ``False``, a number, a text, an empty list or dict) is left out;
  decoding fills the default back in. These defaults are therefore part of the wire format
  (``tests/core/test_wire.py`` pins them): changing one changes what recorded histories decode
  to. Nested models always travel whole; the tag of the ``AttemptOutcome`` union is said,
  except for the common ``ran``; a ran attempt's times travel as microseconds in one list.
- **What the request said** (``seal_outcome`` in the tool activity, ``open_outcome`` in the
  workflow): an attempt's outcome leaves out the requested tool's name, a success's
  reflector and the parts of the dispatch record the request implies.

Models themselves know nothing of this: ``model_dump()`` of any model says every field.
Pure module: workflow code imports it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from tooltrail.core.results import ToolDispatchResult
from tooltrail.core.text import canonical_json
from tooltrail.core.wire import (
    AttemptOutcome,
    BreakerRefused,
    ExecuteAttempt,
    Flush,
    HookRefused,
    HooksPassed,
    Ran,
    RecordTurn,
    ShadowServed,
    TurnInput,
    TurnOutput,
    TurnPlan,
)

__all__ = [
    "DISPATCH_FIELDS",
    "ENVELOPES",
    "left_out",
    "needs_unpacking",
    "open_outcome",
    "pack",
    "pack_dispatch",
    "seal_outcome",
    "unpack",
    "unpack_dispatch",
]

ENVELOPES: tuple[type[BaseModel], ...] = (
    TurnInput,
    TurnPlan,
    TurnOutput,
    ToolDispatchResult,
    ExecuteAttempt,
    Ran,
    ShadowServed,
    HookRefused,
    HooksPassed,
    BreakerRefused,
    RecordTurn,
    Flush,
)
"""The models that leave their plain defaults out on the wire (wherever they are nested)."""

_SAID: dict[type[BaseModel], frozenset[str]] = {
    # The union's tag: every kind says itself but the common one (a missing tag is ``ran``).
    ShadowServed: frozenset({"kind"}),
    HookRefused: frozenset({"kind"}),
    HooksPassed: frozenset({"kind"}),
    BreakerRefused: frozenset({"kind"}),
}
_LEFT_OUT: dict[type[BaseModel], dict[str, Any]] = {}


def left_out(cls: type[BaseModel]) -> dict[str, Any]:
    """The fields an envelope leaves out when they hold these (default) values."""
    found = _LEFT_OUT.get(cls)
    if found is None:
        found = {}
        said = _SAID.get(cls, frozenset())
        for name, field in cls.model_fields.items():
            if field.is_required() or name in said:
                continue
            default = field.get_default(call_default_factory=True)
            plain = default is None or isinstance(default, bool | int | float | str)
            if plain or default in ([], {}):
                found[name] = default
        _LEFT_OUT[cls] = found
    return found


def pack(value: BaseModel) -> dict[str, Any]:
    """An envelope's JSON form without what decoding puts back (see the module docstring)."""
    data: dict[str, Any] = value.model_dump(mode="json")
    _compact(value, data)
    return data


def _compact(model: BaseModel, data: dict[str, Any]) -> None:
    for name, default in left_out(type(model)).items():
        if name in data and data[name] == default:
            del data[name]
    for name in type(model).model_fields:
        if name in data:
            _compact_nested(getattr(model, name), data[name])
    if isinstance(model, Ran):
        _pack_times(model, data)


def _compact_nested(value: Any, data: Any) -> None:
    if isinstance(value, BaseModel):
        if type(value) in ENVELOPES and isinstance(data, dict):
            _compact(value, data)
    elif isinstance(value, list | tuple) and isinstance(data, list):
        for item, dumped in zip(value, data, strict=False):
            if isinstance(item, BaseModel):
                _compact_nested(item, dumped)
    elif isinstance(value, dict) and isinstance(data, dict):
        for key, item in value.items():
            if isinstance(item, BaseModel) and key in data:
                _compact_nested(item, data[key])


def unpack(data: Any, type_hint: Any) -> Any:
    """Undo what ``pack`` did beyond leaving defaults out (validation fills those in).

    Args:
        data: the decoded JSON of a payload.
        type_hint: the type it is decoded to.
    """
    if not isinstance(data, dict):
        return data
    if type_hint is AttemptOutcome:
        # The common kind leaves its tag unsaid (see ``_SAID``).
        kind = data.get("kind", "ran")
        data = {**data, "kind": kind}
        if kind != "ran":
            return data
    elif type_hint is not Ran:
        return data
    return _unpack_times(data) if "t" in data else data


def needs_unpacking(type_hint: Any) -> bool:
    """Whether payloads of this type need ``unpack`` before validation."""
    return type_hint is AttemptOutcome or type_hint is Ran


# -- an attempt's outcome, against its request ---------------------------------------------


def seal_outcome(outcome: AttemptOutcome, request: ExecuteAttempt) -> AttemptOutcome:
    """The outcome as the tool activity sends it: without what the request says.

    The requested tool's name (when that tool ran), a success's reflector (only failures
    consult it), and the parts of the dispatch record the request implies.
    """
    if not isinstance(outcome, Ran | ShadowServed):
        return outcome
    update: dict[str, Any] = {}
    if outcome.resolved_tool_name == request.tool_name:
        update["resolved_tool_name"] = ""
    if not outcome.is_error:
        update["reflector"] = None
    if isinstance(outcome, Ran) and outcome.dispatch is not None:
        update["dispatch"] = pack_dispatch(outcome.dispatch, **_implied(request, outcome))
    return outcome.model_copy(update=update)


def open_outcome(outcome: AttemptOutcome, request: ExecuteAttempt) -> AttemptOutcome:
    """The outcome whole again, in the workflow that sent ``request`` (undoes ``seal_outcome``)."""
    if not isinstance(outcome, Ran | ShadowServed):
        return outcome
    update: dict[str, Any] = {}
    if not outcome.resolved_tool_name:
        update["resolved_tool_name"] = request.tool_name
    if isinstance(outcome, Ran) and outcome.dispatch is not None:
        update["dispatch"] = unpack_dispatch(outcome.dispatch, **_implied(request, outcome))
    return outcome.model_copy(update=update)


def _implied(request: ExecuteAttempt, outcome: Ran) -> dict[str, Any]:
    return {
        "call_id": request.tool_call_id,
        "attempt": request.attempt,
        "tool_name": request.tool_name,
        "arguments": request.arguments,
        "output": outcome.output,
    }


# -- the dispatch record ---------------------------------------------------------------------

DISPATCH_FIELDS = (
    "call_id",
    "attempt",
    "tool_name",
    "tool_kind",
    "principal_id",
    "raw_arguments",
    "ignored_arguments",
    "effective_arguments",
    "idempotency_key",
    "status",
    "text",
    "value",
    "source_call_id",
    "lease_lost",
    "started_at",
    "finished_at",
)
"""The fields of ``tooltrail.pipeline.dispatcher.DispatchRecord``, in order.

A test keeps them equal."""


def _implied_dispatch(
    *, call_id: str, attempt: int, tool_name: str, arguments: dict[str, Any], output: Any
) -> dict[str, Any]:
    # What the workflow knows of a dispatch record before the activity runs: the activity
    # leaves these out of its outcome when they hold, so the history does not carry them
    # twice. The record counts attempts from 1, the workflow from 0.
    implied: dict[str, Any] = {
        "call_id": call_id,
        "attempt": attempt + 1,
        "tool_name": tool_name,
        "tool_kind": "static",
        "principal_id": None,
        "raw_arguments": arguments,
        "ignored_arguments": [],
        "effective_arguments": canonical_json(arguments),
        "idempotency_key": None,
        "status": "ok",
        "text": None,
        "source_call_id": None,
        "lease_lost": False,
    }
    if isinstance(output, str):
        implied["value"] = output
    return implied


def pack_dispatch(
    record: dict[str, Any],
    *,
    call_id: str,
    attempt: int,
    tool_name: str,
    arguments: dict[str, Any],
    output: Any,
) -> dict[str, Any]:
    """Drop from a dispatch record (JSON form) what ``unpack_dispatch`` can put back.

    Args:
        record: ``DispatchRecord.model_dump(mode="json")``, possibly with extra keys.
        call_id: the attempt's tool call id.
        attempt: the workflow's attempt number (from 0).
        tool_name: the tool the attempt ran.
        arguments: the arguments the workflow sent.
        output: the attempt's output as the outcome carries it.
    """
    implied = _implied_dispatch(
        call_id=call_id, attempt=attempt, tool_name=tool_name, arguments=arguments, output=output
    )
    return {k: v for k, v in record.items() if k not in implied or v != implied[k]}


def unpack_dispatch(
    packed: dict[str, Any],
    *,
    call_id: str,
    attempt: int,
    tool_name: str,
    arguments: dict[str, Any],
    output: Any,
) -> dict[str, Any]:
    """The whole dispatch record again, in field order (a full record comes back as is)."""
    implied = _implied_dispatch(
        call_id=call_id, attempt=attempt, tool_name=tool_name, arguments=arguments, output=output
    )
    full = {
        k: packed[k] if k in packed else implied[k]
        for k in DISPATCH_FIELDS
        if k in packed or k in implied
    }
    full.update((k, v) for k, v in packed.items() if k not in full)
    return full


# -- a ran attempt's times -------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICRO


def _moment(micros: int) -> datetime:
    return _EPOCH + micros * _MICRO


def _iso_z(moment: datetime) -> str:
    # The form pydantic gives a UTC datetime in JSON (the dispatch record's timestamps).
    fraction = f".{moment.microsecond:06d}" if moment.microsecond else ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def _exact_micros(text: Any) -> int | None:
    """Microseconds of an ISO text that ``_iso_z`` writes back exactly; else ``None``."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.utcoffset() != timedelta(0) or _iso_z(moment) != text:
        return None
    return _micros(moment)


def _pack_times(outcome: Ran, data: dict[str, Any]) -> None:
    """Put the outcome's times in one list ``t`` of whole microseconds.

    ``[started, finished - started, duration, dispatch started - started, dispatch finished
    - started]``: ISO texts cost ~45 bytes each in every call's history. Times that do not
    pack exactly (another time zone, a duration finer than microseconds) stay as they are;
    the dispatch record's two leave ``data`` only when they pack exactly.
    """
    started, finished = outcome.started_at, outcome.finished_at
    if started is None or finished is None or started.utcoffset() != timedelta(0):
        return
    if finished.utcoffset() != timedelta(0):
        return
    duration = round(outcome.duration_ms * 1000)
    if duration / 1000 != outcome.duration_ms:
        return  # more digits than microseconds: keep the float as it is
    base = _micros(started)
    times = [base, _micros(finished) - base, duration]
    dispatch = data.get("dispatch")
    if isinstance(dispatch, dict):
        begun = _exact_micros(dispatch.get("started_at"))
        ended = _exact_micros(dispatch.get("finished_at"))
        if begun is not None and ended is not None:
            data["dispatch"] = {
                k: v for k, v in dispatch.items() if k not in ("started_at", "finished_at")
            }
            times += [begun - base, ended - base]
    for name in ("started_at", "finished_at", "duration_ms"):
        data.pop(name, None)
    data["t"] = times


def _unpack_times(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    base, finished, duration, *dispatch_times = data.pop("t")
    data["started_at"] = _moment(base)
    data["finished_at"] = _moment(base + finished)
    data["duration_ms"] = duration / 1000
    if dispatch_times and isinstance(data.get("dispatch"), dict):
        begun, ended = dispatch_times
        data["dispatch"] = {
            **data["dispatch"],
            "started_at": _iso_z(_moment(base + begun)),
            "finished_at": _iso_z(_moment(base + ended)),
        }
    return data
