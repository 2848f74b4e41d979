"""Exact model-visible texts and the pure helpers every layer shares.

Hashing, memory, hook contexts and the reflector all read outputs through ``render_text``, and
every hash uses ``stable_hash`` (the built-in ``hash`` is randomised per process and would
break replay). Pure module: workflow code imports it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from tooltrail.core.results import ImagePart, Part, TextPart, ToolCall

__all__ = [
    "BREAKER_OPEN",
    "MAX_ARGUMENT_DEPTH",
    "MEMORY_FIELD_LIMIT",
    "NON_FINITE_ARGUMENTS",
    "NOT_RECORDED",
    "QUOTE_CHARS",
    "TOO_DEEP",
    "argument_problem",
    "canonical_json",
    "duplicate_call_id",
    "encodable_arguments",
    "encodable_call",
    "holds_non_finite",
    "invalid_arguments",
    "json_prefix",
    "nesting_exceeds",
    "not_available",
    "not_found",
    "panicked",
    "quoted",
    "render_text",
    "stable_hash",
    "text_nesting_exceeds",
    "timed_out",
    "too_many_calls",
    "trajectory",
    "trunc",
]

MEMORY_FIELD_LIMIT = 500
"""Characters of input and of result kept in a trajectory memory entry (spec §5)."""


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of a value: sorted keys, compact, non-ASCII kept.

    tooltrail's one canonical encoder: idempotency keys, signed statements, snapshots, the
    hash chain, loop detection and memo keys all hash or compare its text. NaN and the
    infinities are refused, because JSON has no such numbers: no two readers would agree on
    the bytes (the workflow answers a model's ``NaN`` as invalid arguments before any of
    these see it).

    Raises:
        ValueError: ``value`` holds NaN or an infinity.
        TypeError: ``value`` is not JSON data.
    """
    return json.dumps(
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
    )


def render_text(output: str | list[Part] | list[TextPart | ImagePart]) -> str:
    """Render an output to text: text as is, multipart parts joined by newlines."""
    if isinstance(output, str):
        return output
    rendered: list[str] = []
    for part in output:
        if isinstance(part, TextPart):
            rendered.append(part.text)
        else:
            rendered.append(f"[image: {part.media_type}]")
    return "\n".join(rendered)


def stable_hash(text: str) -> str | None:
    """Return a 64-bit blake2b digest (hex) of ``text``, or ``None`` for empty text."""
    if not text:
        return None
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def trunc(text: str, limit: int = MEMORY_FIELD_LIMIT) -> str:
    """Keep the first ``limit`` characters (code points) and mark a cut with ``…``."""
    return text if len(text) <= limit else text[:limit] + "\u2026"


def trajectory(tool: str, input_text: str, result_text: str) -> str:
    """Return the content of a trajectory memory entry (spec §5)."""
    return f"tool={tool}; input={trunc(input_text)}; result={trunc(result_text)}"


BREAKER_OPEN = "tool temporarily unavailable: circuit breaker open"
"""The soft result of a call refused by an open circuit breaker (spec §11.3)."""


def too_many_calls(count: int, limit: int) -> str:
    """Text for a turn with more tool calls than ``RunConfig.max_calls`` (nothing runs)."""
    return (
        f"too many tool calls: the turn has {count}, at most {limit} are accepted per turn "
        "(RunConfig.max_calls); none was run"
    )


QUOTE_CHARS = 200
"""Characters of a model-chosen name or id that a workflow-made answer quotes: the model may
send a name of any length, and every answer is kept in the turn's result and trail."""


def quoted(value: str, limit: int | None = QUOTE_CHARS) -> str:
    """``value`` cut to ``limit`` characters, saying how long it was (``None``: uncut)."""
    if limit is None or len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value)} characters)"


def not_available(name: str, limit: int | None = QUOTE_CHARS) -> str:
    """Text for a call to a tool that was never advertised (spec §3.1); see ``quoted``."""
    return f"tool '{quoted(name, limit)}' is not available"


def not_found(name: str, names: Iterable[str]) -> str:
    """Text for a registry miss at the core (spec §3.2)."""
    ordered = sorted(names)
    if not ordered:
        listed = "none registered"
    elif len(ordered) > 10:
        listed = ", ".join(ordered[:10]) + f"... (and {len(ordered) - 10} more)"
    else:
        listed = ", ".join(ordered)
    return f"Tool not found: {name}. Available: {listed}"


def panicked(name: str, message: str) -> str:
    """Text for a tool body that raised something other than ``ToolError`` (spec §2.3)."""
    if not message:
        return f"tool '{name}' panicked (unknown payload)"
    return f"tool '{name}' panicked: {message}"


def timed_out(name: str, seconds: float) -> str:
    """Text for an attempt that ran out of its time (spec §2.3's timeout text).

    The tool's own ``timeout_s`` and Temporal's timeout of the attempt (``tool_timeout_s``)
    give the model the same words.
    """
    return f"Tool '{name}' timed out after {seconds:g}s"


def duplicate_call_id(call_id: str, limit: int | None = QUOTE_CHARS) -> str:
    """Text for a call whose id an earlier call of the same turn already used."""
    return (
        f"duplicate tool_call_id '{quoted(call_id, limit)}': only the first call with this id runs"
    )


def invalid_arguments(reason: str) -> str:
    """Text for raw JSON arguments that are not a JSON object."""
    return f"invalid arguments: {reason}"


MAX_ARGUMENT_DEPTH = 64
"""Nesting deeper than this is refused: payload encoders and decoders have depth limits, and
a payload that cannot be encoded would stall a turn."""


def nesting_exceeds(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Whether dicts and lists in ``value`` nest deeper than ``limit``.

    Iterative on purpose: the value may be nested deeper than Python's recursion limit.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return False


TOO_DEEP = f"nested deeper than {MAX_ARGUMENT_DEPTH} levels"
"""Why arguments nested too deep are refused (after ``invalid arguments: ``)."""

# A JSON string (escapes included; an unterminated one runs to the end) or a bracket: what
# the nesting of JSON text is read from, so brackets inside strings do not count.
_JSON_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def text_nesting_exceeds(text: str, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Whether JSON text holds a value nested deeper than ``limit`` levels, read unparsed.

    True when the text opens more than ``limit + 1`` objects and arrays at once: the last
    one opened is a value ``limit + 1`` levels deep (``nesting_exceeds`` of what the text
    parses to), whether the rest of the text parses or not. Text that opens fewer may still
    nest a scalar one level too deep: it parses safely, and ``nesting_exceeds`` answers.
    Read before parsing because Python's parser gives up (``RecursionError``) at about a
    thousand levels, and a model may send a hundred thousand.
    """
    if text.count("[") + text.count("{") <= limit + 1:
        return False  # the common case, at C speed
    depth = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit + 1:
                return True
        elif token in ("]", "}"):
            depth = max(0, depth - 1)
    return False


def json_prefix(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> str:
    """The JSON text of ``value``, cut just after its first value nested too deep opens.

    The cut comes after the first object or array ``limit + 1`` levels deep, so
    ``text_nesting_exceeds`` says the text nests too deep. For a value nested too deeply for
    ``json.dumps`` (about a thousand levels): this recursion is bounded by ``limit``. Keys
    that are not strings are written as their ``str``.
    """
    parts: list[str] = []

    def write(item: Any, level: int) -> bool:
        # False once the cut is made: nothing more is written.
        if isinstance(item, dict):
            parts.append("{")
            if level > limit:
                return False
            for index, (key, child) in enumerate(item.items()):
                if index:
                    parts.append(", ")
                parts.append(json.dumps(key if isinstance(key, str) else str(key)) + ": ")
                if not write(child, level + 1):
                    return False
            parts.append("}")
        elif isinstance(item, list):
            parts.append("[")
            if level > limit:
                return False
            for index, child in enumerate(item):
                if index:
                    parts.append(", ")
                if not write(child, level + 1):
                    return False
            parts.append("]")
        else:
            parts.append(json.dumps(item, default=str))
        return True

    write(value, 0)
    return "".join(parts)


def encodable_arguments(arguments: dict[str, Any] | str) -> dict[str, Any] | str:
    """Arguments in a form Temporal's payloads carry: a mapping nested too deep as its text.

    A mapping nested deeper than ``MAX_ARGUMENT_DEPTH`` could not be encoded into a workflow
    or activity payload, or decoded from one (pydantic's depth limits): it travels as its
    JSON text instead, which the turn refuses as nested too deep. Deeper than ``json.dumps``
    can go, the text is cut past the limit (``json_prefix``).
    """
    if isinstance(arguments, str) or not nesting_exceeds(arguments):
        return arguments
    try:
        return json.dumps(arguments)
    except (ValueError, RecursionError, TypeError):
        return json_prefix(arguments)


def encodable_call(call: ToolCall) -> ToolCall:
    """``call`` itself, or a copy whose arguments are ``encodable_arguments``."""
    arguments = encodable_arguments(call.arguments)
    if arguments is call.arguments:
        return call
    return call.model_copy(update={"arguments": arguments})


def argument_problem(arguments: dict[str, Any], max_bytes: int) -> str | None:
    """Why a call's arguments cannot be dispatched (the soft error text), or ``None``.

    The same checks for the model's calls and for a reflector's ``InputFix``: nesting, text
    that is not valid Unicode, and size (``RunConfig.max_argument_bytes``).
    """
    if nesting_exceeds(arguments):
        return invalid_arguments(TOO_DEEP)
    try:
        size = len(json.dumps(arguments, ensure_ascii=False, default=str).encode("utf-8"))
    except UnicodeEncodeError:
        return invalid_arguments("contains text that is not valid Unicode (a lone surrogate)")
    except (ValueError, RecursionError, TypeError) as exc:
        return invalid_arguments(f"cannot be encoded as JSON ({type(exc).__name__})")
    if size > max_bytes:
        return invalid_arguments(f"{size} bytes of arguments; at most {max_bytes} are accepted")
    return None


NON_FINITE_ARGUMENTS = "NaN and Infinity are not JSON numbers"
"""Why arguments holding a non-finite number are refused (after ``invalid arguments: ``)."""


def holds_non_finite(value: Any) -> bool:
    """Whether ``value`` holds a float NaN or infinity anywhere in its dicts and lists.

    Iterative on purpose, like ``nesting_exceeds``; callers check nesting first.
    """
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


NOT_RECORDED = "not recorded: would run live"
"""A shadow attempt's soft output when the original attempt has no result to serve."""
