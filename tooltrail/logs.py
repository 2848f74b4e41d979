"""Logging: text or JSON lines that name the turn, the call and the attempt; no secrets.

``configure_logging`` installs one handler on the root logger. Each line carries, when known:

- ``turn_id``: in a tool activity, the activity's workflow id (a turn is a workflow); in
  workflow code, the id on the ``temporal_workflow`` extra that Temporal's replay-safe
  ``workflow.logger`` adds (use that logger in workflows: it is silent during replay, so a
  replayed turn does not log everything twice);
- ``tool_call_id`` and ``attempt`` (tooltrail's 0-based recovery attempt): from
  ``call_context``, which the tool activity enters around each attempt. Workflow code passes
  them explicitly: ``workflow.logger.info("...", extra={"tool_call_id": c, "attempt": n})``;
  explicit extras on a record always win;
- ``activity_attempt``: Temporal's own 1-based attempt of the activity (infrastructure
  retries of the same tooltrail attempt).

Secrets never reach the output: ``SecretFilter`` (on the handler, so it sees every record
the handler writes, whichever logger emitted it) replaces the values of the known secret
settings, and anything shaped like ``api_key=...``, ``password=...``, ``Authorization: ...``,
``Bearer ...`` or a URL's password, in the message, the traceback and the stack.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from pydantic import ValidationError
from temporalio import activity, workflow

from tooltrail.settings import MASK, Settings

__all__ = [
    "HANDLER_NAME",
    "CallContext",
    "JsonFormatter",
    "SecretFilter",
    "TextFormatter",
    "call_context",
    "configure_logging",
    "core_logging_config",
    "current_call",
    "forward_core_logs",
    "log_context",
]

CORE_LOGGER = "temporalio.core"
"""The Python logger that receives the Temporal core's (Rust) log lines (``forward_core_logs``)."""

HANDLER_NAME = "tooltrail"
"""Name of the handler ``configure_logging`` installs (and replaces when called again)."""

# A secret shorter than this is not masked: replacing every "ab" in every line would garble
# the logs, and no real key is that short.
_MIN_SECRET_LENGTH = 4

# ``scheme://user:password@``; greedy up to the authority's last '@' (passwords hold '@').
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^/\s]+@")
# RFC 6750 tokens after "Bearer"; after "Basic" only base64 of some length, so that prose
# ("basic usage") stays readable.
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]+=*|\b(basic)\s+[A-Za-z0-9+/]{8,}={0,2}")
# ``api_key=...``, ``"password": "..."``, ``Authorization: ...`` (not followed by a scheme
# word: ``_BEARER`` masks the token after it). No leading \b: ``openai_api_key=`` counts.
_KEY_VALUE = re.compile(
    r"(?i)(api[_-]?key|authorization|password|passwd|secret|access[_-]?token)"
    r"([\"']?\s*[=:]\s*)(?!(?:bearer|basic)\s)(\"[^\"]*\"|'[^']*'|[^\s\"']+)"
)


@dataclass(frozen=True)
class CallContext:
    """The tool call an activity is working on, for log lines."""

    turn_id: str
    """The turn (workflow id)."""
    tool_call_id: str
    """The model-issued call id."""
    attempt: int
    """tooltrail's 0-based recovery attempt."""


_CALL: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "tooltrail_call", default=None
)


@contextlib.contextmanager
def call_context(turn_id: str, tool_call_id: str, attempt: int) -> Iterator[CallContext]:
    """Tag every log line written inside the block with this call.

    A context variable, so it follows the block into tasks it starts and into
    ``asyncio.to_thread`` (sync tool bodies), and never leaks into concurrent attempts.

    Args:
        turn_id: the turn (workflow id).
        tool_call_id: the model-issued call id.
        attempt: tooltrail's 0-based recovery attempt.
    """
    context = CallContext(turn_id=turn_id, tool_call_id=tool_call_id, attempt=attempt)
    token = _CALL.set(context)
    try:
        yield context
    finally:
        _CALL.reset(token)


def current_call() -> CallContext | None:
    """Return the innermost ``call_context``, or ``None``."""
    return _CALL.get()


def log_context(record: logging.LogRecord) -> dict[str, Any]:
    """Return the turn/call/attempt fields that apply to ``record`` (empty when none do)."""
    fields: dict[str, Any] = {}
    details: Mapping[str, Any] | None = getattr(record, "temporal_workflow", None)
    if isinstance(details, Mapping):
        fields.update(_workflow_fields(details))
    activity_details: Mapping[str, Any] | None = getattr(record, "temporal_activity", None)
    if not isinstance(activity_details, Mapping) and activity.in_activity():
        # A plain logger (``tooltrail.tool``, a library's) called from inside an activity.
        info = activity.info()
        activity_details = {
            "workflow_id": info.workflow_id,
            "workflow_type": info.workflow_type,
            "attempt": info.attempt,
        }
    if isinstance(activity_details, Mapping):
        fields.update(_workflow_fields(activity_details))
        fields["activity_attempt"] = activity_details.get("attempt")
    call = _CALL.get()
    if call is not None:
        fields.update(turn_id=call.turn_id, tool_call_id=call.tool_call_id, attempt=call.attempt)
    for name in ("turn_id", "tool_call_id", "attempt"):
        if name in record.__dict__:
            fields[name] = record.__dict__[name]
    return {name: value for name, value in fields.items() if value is not None}


def _workflow_fields(details: Mapping[str, Any]) -> dict[str, Any]:
    # Only a TurnWorkflow's id is a turn id; other workflows (session cleanup) keep theirs.
    workflow_id = details.get("workflow_id")
    if details.get("workflow_type") in (None, "TurnWorkflow"):
        return {"turn_id": workflow_id}
    return {"workflow_id": workflow_id, "workflow_type": details.get("workflow_type")}


class SecretFilter(logging.Filter):
    """Mask secrets in records: known values, and anything shaped like a credential.

    It rewrites the record (message with its arguments merged, traceback, stack), so every
    handler after it sees the masked text too.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Create the filter.

        Args:
            secrets: literal values to mask wherever they appear (shorter than 4
                characters are ignored).
        """
        super().__init__()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str) -> None:
        """Mask these values from now on as well."""
        self._secrets.update(s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH)
        # Longest first, so a secret containing another is masked whole.
        ordered = sorted(self._secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def redact(self, text: str) -> str:
        """Return ``text`` with every secret masked."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        text = _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)
        text = _BEARER.sub(lambda m: f"{m.group(1) or m.group(2)} {MASK}", text)
        return _KEY_VALUE.sub(rf"\g<1>\g<2>{MASK}", text)

    def filter(self, record: logging.LogRecord) -> bool:
        """Mask the record in place; never drops it."""
        try:
            message = record.getMessage()
        except Exception:
            # Bad %-arguments: leave the record alone, the handler reports the error.
            return True
        record.msg = self.redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [turn=… call=… attempt=…]``."""

    def __init__(self) -> None:
        """Create the formatter."""
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """Format the record with its call context appended."""
        text = super().format(record)
        fields = log_context(record)
        if not fields:
            return text
        tags = " ".join(f"{key}={value}" for key, value in fields.items())
        head, newline, rest = text.partition("\n")
        return f"{head} [{tags}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line.

    Keys: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, the fields of
    ``log_context`` (``turn_id``, ``tool_call_id``, ``attempt``, ``activity_attempt``, or
    ``workflow_id``/``workflow_type`` for other workflows), and ``exception``/``stack``.
    Other ``extra`` values are left out on purpose: they are arbitrary objects that could
    hold anything, secrets included.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Format the record as one line of JSON."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(log_context(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(
    format: Literal["text", "json"] | None = None,
    level: str | int | None = None,
    *,
    settings: Settings | None = None,
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send logs to ``stream`` (default: stderr) as text or JSON lines, secrets masked.

    Replaces the handler of an earlier call, so calling it again reconfigures. In JSON mode
    Temporal's ``workflow.logger`` and ``activity.logger`` stop appending their details to
    the message text (the JSON fields carry them).

    Args:
        format: ``text`` or ``json`` (default: ``TOOLTRAIL_LOG_FORMAT``).
        level: the root level (default: ``TOOLTRAIL_LOG_LEVEL``).
        settings: where the defaults and the secrets to mask come from (default: loaded
            from the environment; if they do not validate, text at INFO).
        secrets: more literal values to mask.
        stream: where lines go.

    Returns:
        The installed handler.
    """
    if settings is None:
        try:
            settings = Settings()
        except ValidationError:
            # Logging must come up even when the settings are broken: that error is what
            # the user needs to read.
            settings = None
    chosen_format = format or (settings.log_format if settings else "text")
    chosen_level = level or (settings.log_level if settings else "INFO")
    if isinstance(chosen_level, str):
        chosen_level = chosen_level.upper()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if chosen_format == "json" else TextFormatter())
    handler.addFilter(SecretFilter([*(settings.secret_values() if settings else ()), *secrets]))
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == HANDLER_NAME:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(chosen_level)
    json_mode = chosen_format == "json"
    workflow.logger.workflow_info_on_message = not json_mode
    activity.logger.activity_info_on_message = not json_mode
    return handler


def core_logging_config() -> Any:
    """Return the Temporal runtime's logging config that forwards core lines to Python logging.

    The core (the SDK's Rust part) writes its own lines to stdout by default, in its own
    format, past any handler or secret filter; forwarded, they are records of the
    ``temporalio.core`` logger (WARN and above from the core, ERROR from its dependencies),
    formatted and masked like every other line. Pass it to any ``Runtime`` you build (with
    metrics, say): ``TelemetryConfig(logging=core_logging_config(), ...)``.
    """
    from temporalio.runtime import LogForwardingConfig, LoggingConfig, TelemetryFilter

    return LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER)),
    )


def forward_core_logs() -> None:
    """Make the default Temporal runtime forward the core's log lines to Python logging.

    Call it before the first client or worker is created (they keep the runtime they were
    made with); the CLI does it first thing.
    """
    from temporalio.runtime import Runtime, TelemetryConfig

    runtime = Runtime(telemetry=TelemetryConfig(logging=core_logging_config()))
    Runtime.set_default(runtime, error_if_already_set=False)
