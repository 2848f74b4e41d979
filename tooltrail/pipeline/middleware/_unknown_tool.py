"""``UnknownToolMiddleware``: a "tool not found" result gets a suggestion of a registered name."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from tooltrail.core.similarity import best_match
from tooltrail.pipeline.middleware._core import MiddlewareCall, MiddlewareResult, Next

__all__ = ["UnknownToolMiddleware"]


class UnknownToolMiddleware:
    """Append ``. Did you mean '{best}'?`` to "tool not found" results (spec §3.3).

    It acts only when the result is a soft error with text output whose lowercase form
    contains both ``not found`` and ``tool``. The name compared is the call's name as it
    stands after the inner layers ran (the result's ``resolved_tool_name``, which the core
    sets to the name that reached it), against the registry names captured before dispatch,
    in sorted order, using ``tooltrail.core.similarity.best_match``. **Decision (ours):** a name
    that is itself registered gets no suggestion (suggesting the same name helps nobody,
    e.g. for ``tool 'read' panicked: file not found``).
    """

    DEFAULT_THRESHOLD = 0.4
    """The lowest similarity that yields a suggestion by default."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD) -> None:
        """Set the threshold.

        Args:
            threshold: the lowest acceptable similarity, clamped to ``[0, 1]``.

        Raises:
            ValueError: ``threshold`` is NaN.
        """
        if math.isnan(threshold):
            raise ValueError("threshold must be a number in [0, 1], got NaN")
        self.threshold = min(1.0, max(0.0, float(threshold)))

    @classmethod
    def with_threshold(cls, threshold: float) -> UnknownToolMiddleware:
        """Return a layer with ``threshold`` clamped to ``[0, 1]``.

        Works on the class and on an instance alike.
        """
        return cls(threshold)

    def __repr__(self) -> str:
        return f"UnknownToolMiddleware(threshold={self.threshold!r})"

    def suggest(self, name: str, registry_names: Sequence[str]) -> str | None:
        """Return the registered name to suggest for ``name``, or ``None``.

        Args:
            name: the name that was not found.
            registry_names: the registry's names.

        Returns:
            The best match at or above the threshold.
        """
        if name in registry_names:
            return None
        return best_match(name, registry_names, self.threshold)

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        """Run the rest of the pipeline and add a suggestion to a not-found result.

        Args:
            call: the call as it reaches this layer.
            call_next: the rest of the pipeline.

        Returns:
            The inner result, possibly with ``. Did you mean '{best}'?`` appended.
        """
        result = await call_next(call)
        if not result.is_error or not isinstance(result.output, str):
            return result
        lowered = result.output.lower()
        if "not found" not in lowered or "tool" not in lowered:
            return result
        best = self.suggest(result.resolved_tool_name or call.tool_name, call.registry_names)
        if best is None:
            return result
        return replace(result, output=f"{result.output}. Did you mean '{best}'?")
