"""One fake clock for every test that needs time to stand still or jump."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
"""Where a ``FakeClock`` starts unless told otherwise."""


class FakeClock:
    """A clock that moves only when told to, and counts how often it was read.

    Call it for the time (``InMemoryIdempotencyStore(clock=clock)``, or a pydantic
    ``default_factory``); ``advance`` moves it.
    """

    def __init__(self, start: datetime = T0) -> None:
        self.now = start
        self.calls = 0

    def __call__(self) -> datetime:
        self.calls += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
