"""Worker subprocesses (``tests/faults/fault_worker.py``) that a test may SIGKILL.

Only processes started here are ever signalled, by their own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from tests.faults.fault_tools import FAULT_DIR_ENV

__all__ = ["ROOT", "WorkerProcess", "start_worker", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
T = TypeVar("T")


class WorkerProcess:
    """A running worker subprocess; its stderr goes to ``log``."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, name: str) -> None:
        """Wrap a started process."""
        self.proc = proc
        self.log = log
        self.name = name

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """Whether the process has not exited yet."""
        return self.proc.returncode is None

    async def kill(self) -> int | None:
        """SIGKILL the worker (if still running) and reap it; return its exit status."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout=30)
        return self.proc.returncode

    def pause(self) -> None:
        """SIGSTOP the worker: it keeps its connections and claims, and does nothing."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused worker (if still running)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the worker's stderr (for failure messages)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


async def start_worker(
    address: str,
    task_queue: str,
    database_url: str,
    fault_dir: Path,
    *,
    name: str = "worker",
    lifetime_s: float = 300.0,
) -> WorkerProcess:
    """Start a worker subprocess and wait until it polls the task queue."""
    log = fault_dir / f"{name}-{time.monotonic_ns()}.stderr"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.faults.fault_worker",
            address,
            task_queue,
            database_url,
            str(lifetime_s),
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                FAULT_DIR_ENV: str(fault_dir),
                # Session scratch directories go under the test's directory, not /tmp.
                "TMPDIR": str(fault_dir),
            },
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    worker = WorkerProcess(proc, log, name)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=READY_TIMEOUT_S)
    except TimeoutError:
        line = b""
    if line.strip() != b"ready":
        await worker.kill()
        raise RuntimeError(f"worker {name} did not start ({line!r}):\n{worker.log_tail()}")
    return worker


async def wait_until(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    what: str = "the condition",
) -> T:
    """Poll ``probe`` until it returns something other than ``None``; fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        await asyncio.sleep(interval_s)
