"""A tool attempt's journal: what a Temporal retry of the same attempt must not do again.

Temporal retries a tool activity after an infrastructure failure (a lost worker, a database
write that failed, a missed heartbeat). That retry is the *same* tooltrail attempt (pipeline
spec §0 rule 1), so it must not pass the breaker gate again (a half-open probe's retry would
be refused by its own probe), must not count the outcome twice in the tool's health, and,
above all, must not run a body that already returned.

The journal lives in the attempt's heartbeat details (``tooltrail.pipeline.heartbeats``), which
Temporal hands to the next attempt, and holds:

- ``gate``: the breaker let this attempt through (sent at once when it granted a half-open
  probe, so even a worker killed a moment later leaves the mark);
- ``ran``: the body's result, recorded as soon as the body returns and *before* anything the
  attempt writes afterwards (large outputs, the dispatch record's value, health). A retry
  that finds it adopts the result and only redoes those writes.

What the attempt writes after the body is retried in place until it lands
(``until_written``), heartbeating, so a database outage holds the attempt instead of failing
it: the body's result is never dropped while the worker lives. If the worker dies or the
attempt times out meanwhile, the journal (already on the server, sent by the next beat) lets
the retry finish the job. A result larger than ``JOURNAL_LIMIT_BYTES`` is not journaled
(Temporal refuses heartbeat details over 2 MiB): only the in-place retries protect it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio import activity

from tooltrail.core.wire import Ran
from tooltrail.db.reachability import unreachable
from tooltrail.pipeline.heartbeats import AttemptDetails, beat

__all__ = [
    "JOURNAL_LIMIT_BYTES",
    "AttemptJournal",
    "read_journal",
    "until_written",
]

log = logging.getLogger("tooltrail.tool")

_T = TypeVar("_T")

JOURNAL_LIMIT_BYTES = 1024 * 1024
"""A body result whose JSON is larger is not journaled (heartbeat details stay under 2 MiB)."""

_GATE = "gate"
_RAN = "ran"
_SAME_AS_OUTPUT = "value_is_output"
_FIRST_DELAY_S = 0.2
_MAX_DELAY_S = 5.0


class AttemptJournal(AttemptDetails):
    """The marks a tool attempt leaves for its Temporal retries, in its heartbeat details."""

    @property
    def gate_passed(self) -> bool:
        """Whether an earlier Temporal attempt of this attempt passed the breaker gate."""
        return bool(self.marks.get(_GATE))

    def pass_gate(self, *, send: bool) -> None:
        """Mark the gate as passed; ``send`` heartbeats at once (a granted probe)."""
        self.marks[_GATE] = True
        if send:
            beat()

    @property
    def ran(self) -> Ran | None:
        """The body's result journaled by an earlier Temporal attempt, if any."""
        raw = self.marks.get(_RAN)
        if raw is None:
            return None
        dispatch = raw.get("dispatch")
        if isinstance(dispatch, dict) and dispatch.get(_SAME_AS_OUTPUT):
            dispatch = {k: v for k, v in dispatch.items() if k != _SAME_AS_OUTPUT}
            raw = {**raw, "dispatch": {**dispatch, "value": raw.get("output")}}
        try:
            return Ran.model_validate(raw)
        except ValidationError:
            log.warning("unreadable body journal; the body runs again", exc_info=True)
            return None

    def record_ran(self, ran: Ran) -> bool:
        """Journal the body's result (before the attempt writes anything after the body).

        Nothing is sent yet: the next heartbeat carries it (the attempt's own beat, or the
        first retry of a failed write), so an attempt whose writes land at once pays nothing.

        Returns:
            Whether the result was small enough to journal.
        """
        raw = ran.model_dump(mode="json")
        dispatch = raw.get("dispatch")
        if isinstance(dispatch, dict) and dispatch.get("value") == raw["output"]:
            # The dispatch record's value is the output, usually: journal it once.
            raw["dispatch"] = {**dispatch, "value": None, _SAME_AS_OUTPUT: True}
        if len(json.dumps(raw, ensure_ascii=False).encode("utf-8")) > JOURNAL_LIMIT_BYTES:
            return False
        self.marks[_RAN] = raw
        return True


def read_journal(details: Sequence[Any] | None) -> AttemptJournal:
    """The journal an earlier Temporal attempt left in ``details`` (empty if none)."""
    journal = AttemptJournal()
    for detail in details or ():
        if isinstance(detail, dict):
            journal.marks.update(detail)
    return journal


async def until_written(
    write: Callable[[], Awaitable[_T]],
    *,
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> _T:
    """Run ``write`` until it succeeds, backing off (0.2 s doubling, at most 5 s).

    Only an ``unreachable`` database is retried: anything else (a value the database refuses)
    would fail the same way forever, and raises at once.

    For what an attempt writes after its body returned: failing the activity would make
    Temporal run the attempt again. Each retry heartbeats (with the journal), so Temporal
    still sees a live worker and cancellation still arrives (it ends the wait).

    Args:
        write: the write.
        what: what is written, for the log.
        sleep: waits between tries (replaceable in tests).
    """
    delay = _FIRST_DELAY_S
    started = time.monotonic()
    tries = 0
    while True:
        try:
            return await write()
        except Exception as exc:
            if not unreachable(exc):
                raise
            tries += 1
            if tries == 1 or tries % 10 == 0:
                log.warning(
                    "%s failed after the body returned (try %d, %.1f s); retrying until it "
                    "lands, the body will not run again",
                    what,
                    tries,
                    time.monotonic() - started,
                    exc_info=True,
                )
        if _in_activity():
            beat()
        await sleep(delay)
        delay = min(delay * 2, _MAX_DELAY_S)


def _in_activity() -> bool:
    try:
        activity.info()
    except RuntimeError:
        return False
    return True
