"""Loop detection (pipeline spec §10): the session's operation window and warned set.

Pure and deterministic, so workflow code runs it: no I/O, no clock, no randomness, no global
state. Every hash is ``stable_hash`` (never the built-in ``hash``), and the detector is a
pydantic model, so the session carries it from one turn workflow to the next (spec §0 rule 5)
as plain JSON.

The dispatcher uses it like this, per attempt (spec §2.1):

* step 3, when ``config.enabled``: ``check = detector.check(config, thresholds)``; if
  ``check.pattern`` is set, fire ``on_loop_detected(check.pattern, check.repetitions)``; if
  ``check.should_stop``, call ``detector.stop(check)``, emit the refusal ``on_tool_post`` with
  ``check.refusal_text()`` and raise ``LoopDetected(check.message)``;
* step 6a: ``detector.record(operation, config)`` with
  ``operation = operation_for(tool, arguments, render_text(output), primary_param)``;
* at the end of every run: ``detector.end_of_run(config, thresholds)`` (spec §10.4).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tooltrail.core.config import LoopDetection
from tooltrail.core.text import canonical_json, stable_hash

__all__ = [
    "DEFAULT_SUGGESTION",
    "PARAM_TEXT_LIMIT",
    "LoopCheck",
    "LoopDetector",
    "Operation",
    "bounded_param",
    "operation_for",
    "primary_value",
]

DEFAULT_SUGGESTION = "Consider a different approach or tool."
"""Tail of the host warning when the tool signature offers no suggestion (spec §10.3)."""

PARAM_TEXT_LIMIT = 256
"""Characters of a param the window keeps; a longer one is kept as its head and a digest.

The window is session state: it rides in activity payloads and the ``session_state`` row,
so it must stay small whatever the calls (a 380 KB file write must not brick the session).
Identity is unchanged: two params share a bounded form only if they are equal (up to a
64-bit digest collision); the messages of a param within the limit read as the spec says.
"""


def bounded_param(param: str) -> str:
    """Return ``param``, or its first characters, ``…#`` and its digest if it is too long."""
    if len(param) <= PARAM_TEXT_LIMIT:
        return param
    digest = stable_hash(param) or ""
    return f"{param[: PARAM_TEXT_LIMIT - len(digest) - 2]}\u2026#{digest}"


class Operation(BaseModel):
    """One recorded attempt: ``(tool, primary_param, result_hash)`` (spec §10.2).

    Two operations are identical only when all three fields are equal.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    """The requested tool name of the attempt."""
    param: str
    """The primary parameter, or the canonical JSON of the whole input (``bounded_param``)."""
    result_hash: str | None
    """``stable_hash(render_text(output))``; ``None`` for empty output text."""

    @field_validator("param")
    @classmethod
    def _bounded(cls, value: str) -> str:
        # Also bounds windows saved before params were bounded, as they are loaded.
        return bounded_param(value)

    @property
    def pattern(self) -> str:
        """The display form ``{tool}({param})``."""
        return f"{self.tool}({self.param})"


def operation_for(
    tool: str, arguments: dict[str, Any], output_text: str, primary_param: str = ""
) -> Operation:
    """Build the operation of one attempt (spec §10.2).

    Args:
        tool: The tool name the attempt requested.
        arguments: The attempt's input.
        output_text: ``render_text`` of the attempt's output.
        primary_param: The signature's ``extract_primary_param``; ``""`` (the default
            signature) means the canonical JSON of the whole input.

    Returns:
        The operation to record at step 6a.
    """
    param = primary_param or canonical_json(arguments)
    return Operation(tool=tool, param=param, result_hash=stable_hash(output_text))


def primary_value(arguments: Mapping[str, Any], name: str | None) -> str:
    """Return the primary parameter of a call (the signature's ``extract_primary_param``).

    Args:
        arguments: The attempt's input.
        name: The argument the tool declared as primary (``@tool(primary_param=...)``), or
            ``None``.

    Returns:
        The argument's value (a string as is, unless it holds a NUL character, anything
        else as canonical JSON), or ``""``
        (which ``operation_for`` replaces with the whole input) when there is none.
    """
    if name is None or name not in arguments:
        return ""
    value = arguments[name]
    if isinstance(value, str) and "\x00" not in value:
        return value
    # JSON escapes a NUL character, which PostgreSQL refuses to store in the session's state.
    return canonical_json(value)


def _key(op: Operation) -> tuple[str, str, bool, str]:
    """Total, deterministic sort key of an operation (a ``None`` hash sorts first)."""
    return (op.tool, op.param, op.result_hash is not None, op.result_hash or "")


class LoopCheck(BaseModel):
    """Outcome of the pre-check (spec §10.3). Empty (no pattern) when nothing repeats enough."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates: tuple[Operation, ...] = ()
    """Operations at the maximum count (ties included), sorted by ``(tool, param)``."""
    pattern: str | None = None
    """``{tool}({param})`` of the first candidate, for ``on_loop_detected``."""
    repetitions: int = 0
    """The maximum count among candidates (0 without a pattern)."""
    should_stop: bool = False
    """``stop_threshold > 0 and repetitions >= stop_threshold``."""
    message: str | None = None
    """``{tool}({param}) repeated {n} times`` when stopping (the ``LoopDetected`` message)."""

    def error_text(self) -> str | None:
        """Return ``Loop detected: {message}`` when stopping (spec §2.1 step 3's ``{err}``)."""
        return None if self.message is None else f"Loop detected: {self.message}"

    def refusal_text(self) -> str | None:
        """Return the soft output of the refusal ``on_tool_post`` when stopping (step 3)."""
        error = self.error_text()
        return None if error is None else f"dispatch refused before execution: {error}"

    def host_warning(self, suggestion: str | None = None) -> str | None:
        """Return the host warning text of spec §10.3, or ``None`` without a pattern.

        Args:
            suggestion: The tool signature's suggestion; ``None`` or empty falls back to
                ``DEFAULT_SUGGESTION``.
        """
        if self.pattern is None:
            return None
        text = (
            f"Loop detected: Operation '{self.pattern}' repeated {self.repetitions} times"
            " with same result."
        )
        if self.should_stop:
            text += " STOPPING to prevent infinite loop."
        return f"{text} {suggestion or DEFAULT_SUGGESTION}"


class LoopDetector(BaseModel):
    """Session-scoped detector state: the operation window and the warned set.

    Persist it between turns with ``model_dump_json`` / ``model_validate_json``. Every method is
    O(window) plus O(log warned) in the common case (a progress flush costs O(warned) more).
    """

    model_config = ConfigDict(extra="forbid")

    window: list[Operation] = Field(default_factory=list)
    """Recorded operations, oldest first, at most ``config.window`` after each record."""
    warned: list[Operation] = Field(default_factory=list)
    """The warned set: distinct operations sorted by ``(tool, param, result_hash)``."""

    @field_validator("warned")
    @classmethod
    def _canonical_warned(cls, value: list[Operation]) -> list[Operation]:
        """Keep the warned set duplicate-free and in its canonical order."""
        return sorted(set(value), key=_key)

    # -- step 3: the pre-check (never writes) -------------------------------------------------

    def check(
        self, config: LoopDetection, thresholds: Mapping[str, int] | None = None
    ) -> LoopCheck:
        """Count the window and decide (spec §10.3). A pure read.

        Args:
            config: The detection settings; disabled detection never reports a pattern.
            thresholds: Per-tool ``loop_threshold`` overrides (the signature's
                ``tool_thresholds()``); other tools use ``config.loop_threshold``.

        Returns:
            The candidates, the reported pattern and whether the dispatch must stop.
        """
        if not config.enabled or not self.window:
            return LoopCheck()
        overrides = thresholds or {}
        counts = Counter(self.window)
        best = 0
        candidates: list[Operation] = []
        for op, count in counts.items():
            if count < overrides.get(op.tool, config.loop_threshold):
                continue
            if count > best:
                best, candidates = count, [op]
            elif count == best:
                candidates.append(op)
        if not candidates:
            return LoopCheck()
        candidates.sort(key=_key)
        first = candidates[0]
        should_stop = config.stop_threshold > 0 and best >= config.stop_threshold
        return LoopCheck(
            candidates=tuple(candidates),
            pattern=first.pattern,
            repetitions=best,
            should_stop=should_stop,
            message=f"{first.pattern} repeated {best} times" if should_stop else None,
        )

    def stop(self, check: LoopCheck) -> None:
        """Apply a stop that fired: clear the window and warn the stopped operation(s).

        Call it only when ``check.should_stop``; every tied candidate enters the warned set.
        """
        self.clear()
        for op in check.candidates:
            self.acknowledge_loop_warning(op)

    def clear(self) -> None:
        """Forget every recorded operation (the warned set stays)."""
        self.window.clear()

    def acknowledge_loop_warning(self, op: Operation) -> None:
        """Add ``op`` to the warned set (the host acknowledged the warning)."""
        position = bisect_left(self.warned, _key(op), key=_key)
        if position == len(self.warned) or self.warned[position] != op:
            self.warned.insert(position, op)

    def repeated(self, pattern: str | None = None) -> list[Operation]:
        """The operations a host acknowledges: the most repeated ones of the window.

        Args:
            pattern: Only operations with this ``{tool}({param})``; ``None``: any.

        Returns:
            The operations at the maximum count among those considered (ties included),
            sorted; empty when the window holds none.
        """
        counts = Counter(op for op in self.window if pattern is None or op.pattern == pattern)
        if not counts:
            return []
        best = max(counts.values())
        return sorted((op for op, count in counts.items() if count == best), key=_key)

    # -- step 6a: the record ------------------------------------------------------------------

    def record(self, op: Operation, config: LoopDetection) -> None:
        """Record one attempt's operation (spec §10.2); a no-op when detection is disabled.

        A progress flush runs first: if ``op`` matches warned entries on tool and param with a
        different hash, those entries leave the warned set and every window entry with that tool
        and param whose hash differs from ``op``'s is dropped. Then ``op`` is appended and the
        oldest entries are dropped beyond ``config.window``.
        """
        if not config.enabled:
            return
        self._progress_flush(op)
        self.window.append(op)
        excess = len(self.window) - config.window
        if excess > 0:
            del self.window[:excess]

    def _progress_flush(self, op: Operation) -> None:
        start = bisect_left(self.warned, (op.tool, op.param, False, ""), key=_key)
        end = start
        flushed = False
        while end < len(self.warned):
            entry = self.warned[end]
            if entry.tool != op.tool or entry.param != op.param:
                break
            flushed = flushed or entry.result_hash != op.result_hash
            end += 1
        if not flushed:
            return
        self.warned[start:end] = [op] if op in self.warned[start:end] else []
        self.window[:] = [
            entry
            for entry in self.window
            if entry.tool != op.tool
            or entry.param != op.param
            or entry.result_hash == op.result_hash
        ]

    # -- run boundary -------------------------------------------------------------------------

    def end_of_run(
        self, config: LoopDetection, thresholds: Mapping[str, int] | None = None
    ) -> bool:
        """Apply the run boundary rule (spec §10.4): clear the window if a stop would fire.

        Returns:
            Whether the window was cleared.
        """
        if not self.check(config, thresholds).should_stop:
            return False
        self.clear()
        return True
