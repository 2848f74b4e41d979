"""Tools for the fault tests: slow bodies that log which process ran them, and when.

Every body start and end is appended to ``$TOOLTRAIL_FAULT_DIR/<tool>.log`` (one line, one
``O_APPEND`` write), so the record survives the worker process that gets killed, and a test
can tell which worker runs the current call and how often a body ran.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tooltrail import CircuitBreaker, Host, Idempotency, ToolContext, tool

__all__ = [
    "BIG_OUTPUT_CHARS",
    "BREAKER",
    "BREAKER_ENV",
    "FAULT_DIR_ENV",
    "LEASE_ENV",
    "TOOLS",
    "BodyRun",
    "big",
    "blocking",
    "charge",
    "host",
    "once",
    "pay",
    "runs",
    "slow",
    "transfer",
    "worker_host",
]

FAULT_DIR_ENV = "TOOLTRAIL_FAULT_DIR"
LEASE_ENV = "TOOLTRAIL_FAULT_LEASE_S"


@dataclass(frozen=True)
class BodyRun:
    """One logged line: a body started or ended."""

    phase: str
    turn_id: str
    label: str
    pid: int
    key: str | None
    at: float
    """Wall-clock time (``time.time()``)."""


def _log(name: str, phase: str, ctx: ToolContext, label: str) -> None:
    fields = (phase, ctx.turn_id or "-", label, os.getpid(), ctx.idempotency_key, time.time())
    line = " ".join(str(field) for field in fields) + "\n"
    path = Path(os.environ[FAULT_DIR_ENV]) / f"{name}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def _body(name: str, ctx: ToolContext, label: str, seconds: float) -> None:
    _log(name, "start", ctx, label)
    await asyncio.sleep(seconds)
    _log(name, "end", ctx, label)


def runs(name: str, directory: Path | None = None) -> list[BodyRun]:
    """The logged body starts and ends of a tool, in order."""
    base = directory or Path(os.environ[FAULT_DIR_ENV])
    path = base / f"{name}.log"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) != 6:
            continue  # never seen: each line is one write
        phase, turn_id, label, pid, key, at = fields
        found.append(
            BodyRun(phase, turn_id, label, int(pid), None if key == "None" else key, float(at))
        )
    return found


@tool
async def slow(ctx: ToolContext, label: str, seconds: float = 0.5) -> str:
    """Sleep ``seconds`` (not idempotent: a lost attempt runs again)."""
    await _body("slow", ctx, label, seconds)
    return f"{label} done"


def _charge_policy() -> bool | Idempotency:
    """``idempotent=True`` (a 60 s lease), or a shorter lease from ``$TOOLTRAIL_FAULT_LEASE_S``.

    A worker killed inside an idempotent body keeps its claim until the lease lapses; only
    then may the retried attempt take the key over, so a short lease keeps a run with many
    kills quick. The variable must be set before this module is imported (worker processes).
    """
    lease = float(os.environ.get(LEASE_ENV) or 0)
    if lease <= 0:
        return True
    return Idempotency(lease_seconds=lease, wait_timeout_seconds=max(30.0, 3 * lease))


@tool(idempotent=_charge_policy())
async def charge(ctx: ToolContext, label: str, order: str, seconds: float = 0.3) -> str:
    """A side effect (the logged start), then a slow answer; declared idempotent.

    The key hashes the arguments, so ``order`` must be unique per call to get a key of its own.
    """
    await _body("charge", ctx, label, seconds)
    return f"charged {label}"


@tool(idempotent=Idempotency(lease_seconds=2.0, wait_timeout_seconds=30.0))
async def pay(ctx: ToolContext, order: str, seconds: float = 2.0) -> str:
    """Idempotent with a 2 s lease (renewed every 0.67 s while the body runs)."""
    await _body("pay", ctx, order, seconds)
    return f"paid {order}"


@tool(retry_on_interrupt=False)
async def once(ctx: ToolContext, order: str, seconds: float = 3.0) -> str:
    """Never run again after a lost worker (``retry_on_interrupt=False``); not idempotent."""
    await _body("once", ctx, order, seconds)
    return f"done once {order}"


@tool(
    idempotent=Idempotency(lease_seconds=0.6, wait_timeout_seconds=30.0),
    retry_on_interrupt=False,
)
async def transfer(ctx: ToolContext, order: str, seconds: float = 3.0) -> str:
    """Idempotent *and* never run again after a lost worker (``retry_on_interrupt=False``).

    The short lease is renewed, with a heartbeat, every 0.2 s while the body runs.
    """
    await _body("transfer", ctx, order, seconds)
    return f"transferred {order}"


BIG_OUTPUT_CHARS = 300 * 1024


@tool
async def big(ctx: ToolContext, label: str, seconds: float = 1.0) -> str:
    """Not idempotent; returns 300 KB (above the large-output threshold: stored in the DB)."""
    await _body("big", ctx, label, seconds)
    return label + "x" * (BIG_OUTPUT_CHARS - len(label))


@tool
async def blocking(ctx: ToolContext, label: str, seconds: float = 3.0) -> str:
    """Not idempotent; one blocking call inside ``async def`` (a sync client, say)."""
    _log("blocking", "start", ctx, label)
    time.sleep(seconds)  # noqa: ASYNC251 - the fault under test
    _log("blocking", "end", ctx, label)
    return f"{label} blocked"


TOOLS = [slow, charge, pay, once, transfer, big, blocking]

host = Host(TOOLS)

BREAKER_ENV = "TOOLTRAIL_FAULT_BREAKER"
"""Set (to anything) for worker processes whose host has the circuit breaker below."""

BREAKER = CircuitBreaker(failure_threshold=1, recovery_s=0.1, probe_timeout_s=120.0)
"""Opens on one failure, grants a probe 0.1 s later, and the probe's lease outlives a retry."""


def worker_host() -> Host:
    """The host of a worker process: ``host``, with ``BREAKER`` if ``$BREAKER_ENV`` is set."""
    if os.environ.get(BREAKER_ENV):
        return Host(TOOLS, circuit_breaker=BREAKER)
    return host
