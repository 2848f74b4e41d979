"""``OutputLimitMiddleware``: a cap on the characters of output the model reads.

Cut output ends with ``TRUNCATION_MARKER``, which counts inside the budget.
"""

from __future__ import annotations

from dataclasses import replace

from tooltrail.core.results import Part, TextPart
from tooltrail.pipeline.middleware._core import MiddlewareCall, MiddlewareResult, Next

__all__ = ["TRUNCATION_MARKER", "OutputLimitMiddleware"]

TRUNCATION_MARKER = "\n[truncated]"
"""Appended to output cut by ``OutputLimitMiddleware``; it counts inside the budget."""


def _limit_text(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    keep = max(0, budget - len(TRUNCATION_MARKER))
    # With a budget smaller than the marker, even the marker is cut: the budget is a
    # hard ceiling on what the model reads.
    return (text[:keep] + TRUNCATION_MARKER)[:budget]


def _limit_parts(parts: list[Part], budget: int) -> list[Part]:
    total = sum(len(part.text) for part in parts if isinstance(part, TextPart))
    if total <= budget:
        return parts
    remaining = max(0, budget - len(TRUNCATION_MARKER))
    out: list[Part] = []
    cut = False
    for part in parts:
        if not isinstance(part, TextPart):
            out.append(part)  # images carry no characters: the budget does not touch them
        elif cut:
            continue  # text after the cut is dropped
        elif len(part.text) < remaining:
            out.append(part)
            remaining -= len(part.text)
        else:
            # total > budget guarantees the cut lands on some text part. A budget smaller
            # than the marker leaves remaining == 0 and cuts the marker itself.
            piece = part.text[:remaining] + TRUNCATION_MARKER
            out.append(TextPart(piece[:budget]))
            cut = True
    return out


class OutputLimitMiddleware:
    r"""Cap the characters of output the model reads.

    Text longer than ``max_chars`` keeps its head and ends with ``\n[truncated]``; the
    marker counts inside the budget, so the result is exactly ``max_chars`` characters.
    ``max_chars=0`` disables the layer. Characters are code points (``len``), not bytes.

    Multipart output (**decision (ours)**): the budget is shared by the text parts, in
    order, counting their characters only (not the newlines ``render_text`` puts between
    parts). The text part where the budget runs out is cut and gets the marker; later text
    parts are dropped; image parts are kept as they are.
    """

    def __init__(self, max_chars: int) -> None:
        """Set the budget.

        Args:
            max_chars: the most characters of output; 0 disables the limit.

        Raises:
            ValueError: ``max_chars`` is negative.
        """
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0 (0 disables the limit), got {max_chars}")
        self.max_chars = max_chars

    def __repr__(self) -> str:
        return f"OutputLimitMiddleware({self.max_chars!r})"

    def limit(self, output: str | list[Part]) -> str | list[Part]:
        """Apply the budget to an output (text or multipart).

        Args:
            output: the output to cap.

        Returns:
            The output, cut to the budget when it exceeds it.
        """
        if self.max_chars == 0:
            return output
        if isinstance(output, str):
            return _limit_text(output, self.max_chars)
        return _limit_parts(output, self.max_chars)

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline and cap its output.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result with its output capped; errors are capped too.
        """
        result = await call_next(call)
        limited = self.limit(result.output)
        return result if limited is result.output else replace(result, output=limited)
