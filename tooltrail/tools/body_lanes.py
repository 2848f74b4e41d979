"""Where tool bodies run: each on a lane of its own (a thread with its own event loop).

A worker runs its workflows, pollers and heartbeats on one event loop. An ``async def`` tool
that makes one blocking call (a sync HTTP client inside async code) would hold that loop:
heartbeats stop, Temporal declares the attempt lost and runs the body again elsewhere, and
every other turn of the worker waits. A sync tool that hangs would hold one of the few
threads of asyncio's default executor (``min(32, cpus + 4)``); a handful of them and no sync
tool runs at all. So bodies run on lanes:

- A lane serves one body at a time. Idle lanes are kept for reuse (up to ``IDLE_LANES``), so a
  call costs a hand-off between threads, not a thread or a loop start.
- Lanes grow with demand, up to ``MAX_LANES``: a hung body holds its lane (threads cannot be
  killed), and the others go on. Past the cap, bodies wait for a lane (logged).
- While an async body runs, its lane's loop ticks; a lane that stops ticking for
  ``BLOCKED_AFTER_S`` has a body that blocks its loop, and the tool is named in the log once.

A body sees the caller's context variables (a copy), like ``asyncio.to_thread`` gives: the
log context of the call, the activity's ``activity.info()``. Cancellation of the caller is
passed on to the body (an async body gets ``CancelledError`` at its next await).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "BLOCKED_AFTER_S",
    "IDLE_LANES",
    "MAX_LANES",
    "run_async_body",
    "run_sync_body",
]

log = logging.getLogger("tooltrail.tool")

_T = TypeVar("_T")

IDLE_LANES = 32
"""Idle lanes kept for reuse; more are closed when their body ends."""
MAX_LANES = 512
"""Lanes at most (hung bodies included); past it a body waits for a lane."""
BLOCKED_AFTER_S = 1.0
"""An async body whose lane did not tick for this long blocks its loop (reported)."""
_TICK_S = 0.2
_WAIT_FOR_LANE_S = 0.05


class _Lane:
    """A daemon thread running an event loop of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.tick = time.monotonic()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._serve, args=(ready,), name="tooltrail-body", daemon=True
        )
        self.thread.start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    async def ticking(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on this lane's loop while a ticker shows the loop is responsive."""

        async def ticker() -> None:
            while True:
                self.tick = time.monotonic()
                await asyncio.sleep(_TICK_S)

        self.tick = time.monotonic()
        beat = asyncio.create_task(ticker())
        try:
            return await coro
        finally:
            beat.cancel()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Lanes:
    """The process's lanes (thread-safe: callers may run on any event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Lane] = []
        self._count = 0
        self._waiting_logged = 0.0

    async def take(self, name: str) -> _Lane:
        while True:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
                if self._count < MAX_LANES:
                    self._count += 1
                    break
                now = time.monotonic()
                log_it = now - self._waiting_logged > 10.0
                if log_it:
                    self._waiting_logged = now
            if log_it:
                log.warning(
                    "tool %r waits for a lane: %d tool bodies are running or hung", name, MAX_LANES
                )
            await asyncio.sleep(_WAIT_FOR_LANE_S)
        try:
            return _Lane()
        except BaseException:
            with self._lock:
                self._count -= 1
            raise

    def give_back(self, lane: _Lane) -> None:
        with self._lock:
            if len(self._idle) < IDLE_LANES:
                self._idle.append(lane)
                return
            self._count -= 1
        lane.close()


_LANES = _Lanes()


def _settle(result: asyncio.Future[Any], outcome: Callable[[asyncio.Future[Any]], None]) -> None:
    if not result.done():
        outcome(result)


def _hand_over(
    caller: asyncio.AbstractEventLoop,
    result: asyncio.Future[Any],
    outcome: Callable[[asyncio.Future[Any]], None],
) -> None:
    # From a lane's thread to the caller's loop; a loop that closed meanwhile wants nothing.
    with contextlib.suppress(RuntimeError):
        caller.call_soon_threadsafe(_settle, result, outcome)


async def run_async_body(name: str, make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run an ``async def`` tool body on a lane of its own; return what it returns.

    Args:
        name: the tool name (for the log).
        make: creates the body's coroutine (called on the lane).

    Raises:
        BaseException: whatever the body raised; ``CancelledError`` if the caller was
            cancelled (the body is cancelled too).
    """
    caller = asyncio.get_running_loop()
    result: asyncio.Future[_T] = caller.create_future()
    lane = await _LANES.take(name)
    context = contextvars.copy_context()
    holder: list[asyncio.Task[_T]] = []

    def finished(task: asyncio.Task[_T]) -> None:
        # On the lane's thread: hand the outcome to the caller's loop, free the lane.
        def deliver(future: asyncio.Future[_T]) -> None:
            if task.cancelled():
                future.cancel()
            elif (exc := task.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(task.result())

        _hand_over(caller, result, deliver)
        _LANES.give_back(lane)

    def start() -> None:
        task = lane.loop.create_task(lane.ticking(make()), context=context)
        holder.append(task)
        task.add_done_callback(finished)

    lane.loop.call_soon_threadsafe(start)
    reported = False
    try:
        while True:
            done, _ = await asyncio.wait({result}, timeout=BLOCKED_AFTER_S)
            if done:
                return result.result()
            stalled = time.monotonic() - lane.tick
            if not reported and stalled >= BLOCKED_AFTER_S:
                reported = True
                log.warning(
                    "async tool %r blocks its event loop (no await for %.1f s): a blocking "
                    "call inside `async def`; it runs on a loop of its own, so heartbeats and "
                    "other tools go on, but use asyncio.to_thread or a sync tool for it",
                    name,
                    stalled,
                )
    except asyncio.CancelledError:
        # Cancel the body on its own loop (it sees it at its next await); its outcome is
        # no longer wanted.
        result.cancel()
        lane.loop.call_soon_threadsafe(_cancel_all, holder)
        raise


def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()


async def run_sync_body(name: str, fn: Callable[[], _T]) -> _T:
    """Run a sync tool body on a lane of its own; return what it returns.

    Unlike ``asyncio.to_thread``, a body that hangs holds only its own lane: other sync
    bodies still get one. On cancellation the caller stops waiting; the thread runs the body
    to its end (threads cannot be interrupted), then serves the next body.

    Args:
        name: the tool name (for the log).
        fn: the body, with its arguments bound.

    Raises:
        BaseException: whatever the body raised.
    """
    caller = asyncio.get_running_loop()
    result: asyncio.Future[_T] = caller.create_future()
    lane = await _LANES.take(name)
    context = contextvars.copy_context()

    def run() -> None:
        # On the lane's thread.
        try:
            value = context.run(fn)
        except BaseException as exc:
            error = exc

            def fail(future: asyncio.Future[_T]) -> None:
                future.set_exception(error)

            _hand_over(caller, result, fail)
        else:

            def succeed(future: asyncio.Future[_T]) -> None:
                future.set_result(value)

            _hand_over(caller, result, succeed)
        finally:
            _LANES.give_back(lane)

    lane.loop.call_soon_threadsafe(run)
    return await result
