"""``RedactingMiddleware``: sensitive matches in the output become ``[REDACTED:<kind>]``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tooltrail.core.results import Part, TextPart
from tooltrail.pipeline.middleware._core import MiddlewareCall, MiddlewareResult, Next

__all__ = ["RedactingMiddleware"]

# Markers already in the text are never matched again, so a broad pattern cannot chew up
# what an earlier pattern inserted.
_MARKER = re.compile(r"(\[REDACTED:[^\]\n]*\])")


class RedactingMiddleware:
    """Replace sensitive matches in the output with ``[REDACTED:<kind>]``.

    Patterns apply in mapping order, each to the text left outside earlier markers; empty
    matches are ignored. Multipart output is redacted part by part (text parts only).
    ``redact_text`` and ``redact_value`` expose the same rules so the engine can apply them
    to what the audit trail stores.
    """

    def __init__(self, patterns: Mapping[str, str | re.Pattern[str]]) -> None:
        r"""Compile the patterns.

        Args:
            patterns: kind -> regular expression (text or compiled), e.g.
                ``{"email": r"[\w.+-]+@[\w-]+\.[\w.]+"}``.

        Raises:
            re.error: a pattern does not compile.
        """
        self.patterns: dict[str, re.Pattern[str]] = {
            kind: re.compile(pattern) if isinstance(pattern, str) else pattern
            for kind, pattern in patterns.items()
        }

    def __repr__(self) -> str:
        return f"RedactingMiddleware({list(self.patterns)!r})"

    def redact_text(self, text: str) -> str:
        """Return ``text`` with every match replaced by ``[REDACTED:<kind>]``.

        Args:
            text: any text.

        Returns:
            The redacted text.
        """
        for kind, pattern in self.patterns.items():
            marker = f"[REDACTED:{kind}]"

            def sub(match: re.Match[str], marker: str = marker) -> str:
                return marker if match.group(0) else ""

            pieces = _MARKER.split(text)
            # split() with a capturing group alternates: text, marker, text, ...
            text = "".join(
                pattern.sub(sub, piece) if index % 2 == 0 else piece
                for index, piece in enumerate(pieces)
            )
        return text

    def redact_output(self, output: str | list[Part]) -> str | list[Part]:
        """Redact a text or multipart output.

        Args:
            output: the output.

        Returns:
            The output with its text redacted; image parts are unchanged.
        """
        if isinstance(output, str):
            return self.redact_text(output)
        return [
            TextPart(self.redact_text(part.text)) if isinstance(part, TextPart) else part
            for part in output
        ]

    def redact_value(self, value: Any) -> Any:
        """Redact every string inside JSON-like data (e.g. a call's input for the audit).

        Args:
            value: a string, or dicts, lists and tuples of them; other values pass through.

        Returns:
            A redacted copy; mapping keys are kept as they are.
        """
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, Mapping):
            return {key: self.redact_value(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_value(item) for item in value]
        return value

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline and redact its output.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result with its output redacted.
        """
        result = await call_next(call)
        return replace(result, output=self.redact_output(result.output))
