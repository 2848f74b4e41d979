"""The wave planner (spec §9.4): greedy first-fit of concurrency-safe calls into waves.

Pure and deterministic, so workflow code runs it. The verdicts (is the call safe, which
resource does it touch) come from the tools' own declarations, evaluated worker-side on the
call's arguments before the turn starts; middleware has no say in the plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

__all__ = ["CallVerdict", "plan_waves"]


class CallVerdict(BaseModel):
    """What a tool declares about one call: may it run concurrently, and on what resource."""

    safe: bool = False
    """``concurrent_safe`` evaluated on the call's arguments (unknown tools: False)."""
    key: str | None = None
    """``resource_key`` of a safe call; calls with equal keys never share a wave."""


def plan_waves(verdicts: Sequence[CallVerdict]) -> list[list[int]]:
    """Return the waves as lists of positions, in creation order.

    Unsafe calls are singleton waves, born closed. A safe call joins the earliest open wave
    that does not hold its key, else opens a new wave; open waves never close. Inside a wave,
    positions keep the model's order.
    """
    waves: list[list[int]] = []
    keys: list[set[str]] = []
    is_open: list[bool] = []
    for position, verdict in enumerate(verdicts):
        if not verdict.safe:
            waves.append([position])
            keys.append(set())
            is_open.append(False)
            continue
        key = verdict.key
        target = next(
            (
                wave
                for wave in range(len(waves))
                if is_open[wave] and (key is None or key not in keys[wave])
            ),
            None,
        )
        if target is None:
            waves.append([])
            keys.append(set())
            is_open.append(True)
            target = len(waves) - 1
        waves[target].append(position)
        if key is not None:
            keys[target].add(key)
    return waves
