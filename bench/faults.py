"""Randomized fault run: turns of slow calls while worker processes are SIGKILLed at random.

Run: ``python -m bench.faults [--turns 20] [--seed S]``. An embedded dev server, a migrated
SQLite audit file (or ``--database-url``, or ``--postgres``: a throwaway server of its own) and
a pool of worker subprocesses (``tests/faults/fault_worker.py``) on one task queue. While the
turns run, a chaos loop kills a random worker (more often one that is running a tool body)
every few seconds and starts a replacement after a random pause. At the end, for every turn:

- turns completed (every result right, turn row ``completed``);
- audit events lost (an expected event or a ``seq`` missing) and duplicated (an event key
  recorded twice, or an unexpected event): both must be 0;
- re-executions of the ``charge`` tool (declared idempotent; a 5 s lease by default, see
  ``--lease``), by cause. A body killed mid-run is taken over once its lease lapses (at least
  once: nobody can know whether its side effect happened), as is one whose worker died between
  the body's end and the outcome's commit. A body that finished on a worker that lived on, or a
  second run while the first one's worker lived, is an idempotent double execution: must be 0.
  If ``ctx.idempotency_key`` is ``None`` (idempotency not wired into the dispatcher), every
  re-execution is reported as at-least-once instead.
- re-executions of ``slow`` (not idempotent): at least once, reported.
- ``big`` (not idempotent, 300 KB outputs stored in the database after the body) and
  ``blocking`` (an ``async def`` body that blocks its loop longer than the 2 s heartbeat
  timeout): a body that finished on a live worker, or ran again with no kill to explain it,
  ran twice because of tooltrail itself: must be 0. With ``--outages`` (and ``--postgres``)
  the database is also stopped for 1-3 s every 6-12 s, so large outputs and audit batches
  meet outages.

Exit status 0 when every turn completed with no event lost or duplicated and no idempotent
double execution.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console
from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV, LEASE_ENV, BodyRun
from tests.faults.pg import throwaway_postgres
from tests.faults.workers import WorkerProcess, start_worker
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.core.results import ToolDispatchResult
from tooltrail.core.wire import AuditEvent
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.runtime.embedded import start_dev_server

MAX_WORKER_START_FAILURES = 5


@dataclass
class Options:
    """The command line."""

    turns: int
    calls_min: int
    calls_max: int
    workers: int
    concurrency: int
    kill_every_min_s: float
    kill_every_max_s: float
    time_limit_s: float
    seed: int
    lease_s: float
    database_url: str | None
    postgres: bool
    keep: bool
    outages: bool = False


@dataclass
class Chaos:
    """What the chaos loop did."""

    kills: int = 0
    kills_in_body: int = 0
    restarts: int = 0
    start_failures: int = 0
    killed_at: dict[int, float] = field(default_factory=dict)
    """Wall-clock time of each kill, by pid."""

    @property
    def killed_pids(self) -> set[int]:
        """The pids the chaos loop killed."""
        return set(self.killed_at)


@dataclass
class Outages:
    """What the outage loop did."""

    count: int = 0
    seconds: float = 0.0


async def outage_loop(
    postgres: Any, rng: random.Random, stop: asyncio.Event, outages: Outages
) -> None:
    """Stop the database for 1-3 s every 6-12 s (a throwaway PostgreSQL of the bench's own)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=rng.uniform(6.0, 12.0))
        if stop.is_set():
            return
        down = rng.uniform(1.0, 3.0)
        await postgres.stop()
        try:
            await asyncio.sleep(down)
        finally:
            await postgres.start()
        outages.count += 1
        outages.seconds += down


@dataclass
class TurnOutcome:
    """One turn as the bench saw it."""

    turn_id: str
    calls: list[ToolCall]
    results: list[ToolDispatchResult] | None = None
    error: str | None = None
    seconds: float | None = None
    """From start to result."""


class WorkerPool:
    """Worker subprocesses on one task queue; dead ones are replaced."""

    def __init__(self, address: str, task_queue: str, url: str, directory: Path, lifetime_s: float):
        self.address = address
        self.task_queue = task_queue
        self.url = url
        self.directory = directory
        self.lifetime_s = lifetime_s
        # The pool runs several workers on one database, SQLite included (refused by
        # default: tooltrail.db.sqlite_guard); the workers inherit this environment.
        os.environ.setdefault("TOOLTRAIL_SQLITE_SHARED", "true")
        self.workers: list[WorkerProcess] = []
        self.everyone: list[WorkerProcess] = []
        self.count = 0

    async def add(self, chaos: Chaos) -> None:
        """Start one worker (a few tries)."""
        for _ in range(MAX_WORKER_START_FAILURES):
            self.count += 1
            try:
                worker = await start_worker(
                    self.address,
                    self.task_queue,
                    self.url,
                    self.directory,
                    name=f"w{self.count}",
                    lifetime_s=self.lifetime_s,
                )
            except RuntimeError as exc:
                chaos.start_failures += 1
                console.print(f"[yellow]worker start failed[/]: {exc}")
                continue
            self.workers.append(worker)
            self.everyone.append(worker)
            return
        raise RuntimeError(f"{MAX_WORKER_START_FAILURES} worker starts failed in a row")

    def live(self) -> list[WorkerProcess]:
        """The workers still running."""
        return [w for w in self.workers if w.alive]

    async def close(self) -> None:
        """Kill every worker this pool started."""
        for worker in self.everyone:
            await worker.kill()


def busy_pids(directory: Path) -> set[int]:
    """Processes with a tool body that started and has not ended (by the same process)."""
    open_bodies: Counter[tuple[str, str, int]] = Counter()
    for name in ("slow", "charge"):
        for run in fault_tools.runs(name, directory):
            key = (run.turn_id, run.label, run.pid)
            open_bodies[key] += 1 if run.phase == "start" else -1
    return {pid for (_, _, pid), n in open_bodies.items() if n > 0}


async def chaos_loop(
    pool: WorkerPool, options: Options, rng: random.Random, stop: asyncio.Event, chaos: Chaos
) -> None:
    """Kill a random worker every few seconds; replace it after a random pause."""
    replacements: set[asyncio.Task[None]] = set()

    async def replace(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await pool.add(chaos)
        chaos.restarts += 1

    try:
        while not stop.is_set():
            pause = rng.uniform(options.kill_every_min_s, options.kill_every_max_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=pause)
            if stop.is_set():
                break
            live = pool.live()
            if not live:
                continue
            busy = busy_pids(pool.directory)
            in_body = [w for w in live if w.pid in busy]
            victim = rng.choice(in_body) if in_body and rng.random() < 0.6 else rng.choice(live)
            chaos.kills += 1
            chaos.kills_in_body += victim.pid in busy
            chaos.killed_at[victim.pid] = time.time()
            await victim.kill()
            pool.workers.remove(victim)
            task = asyncio.create_task(replace(rng.uniform(0.0, 2.0)))
            replacements.add(task)
            task.add_done_callback(replacements.discard)
    finally:
        for task in list(replacements):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=90)


def make_turn(rng: random.Random, options: Options) -> TurnOutcome:
    """A turn: a random mix of ``charge`` (the side effect) and ``slow`` calls."""
    turn_id = f"faults-{uuid.uuid4()}"
    calls = []
    for i in range(rng.randint(options.calls_min, options.calls_max)):
        arguments: dict[str, Any] = {"label": f"c{i}", "seconds": round(rng.uniform(0.1, 0.8), 2)}
        # Mostly the side effect and plain calls; some large outputs and blocking bodies.
        [name] = rng.choices(["charge", "slow", "big", "blocking"], weights=[3, 3, 1, 1])
        if name == "blocking":
            arguments["seconds"] = round(rng.uniform(2.2, 2.6), 2)  # > the heartbeat timeout
        if name == "charge":
            arguments["order"] = f"{turn_id}-c{i}"  # a key of its own (keys hash arguments)
        calls.append(ToolCall(f"c{i}", name, arguments))
    return TurnOutcome(turn_id, calls)


def expected_output(call: ToolCall) -> str:
    """What the call's tool returns."""
    assert isinstance(call.arguments, dict)
    label = call.arguments["label"]
    if call.name == "big":
        return label + "x" * (fault_tools.BIG_OUTPUT_CHARS - len(label))
    if call.name == "blocking":
        return f"{label} blocked"
    return f"charged {label}" if call.name == "charge" else f"{label} done"


def audit_faults(outcome: TurnOutcome, events: list[AuditEvent]) -> tuple[int, int, list[str]]:
    """Count lost and duplicated events of a finished turn; describe each problem."""
    assert outcome.results is not None
    problems = []
    expected: set[tuple[str, str | None, int | None]] = {
        ("turn_started", None, None),
        ("turn_end", None, None),
    }
    for call, result in zip(outcome.calls, outcome.results, strict=True):
        expected |= {("tool_call_received", call.id, None), ("tool_pre", call.id, 0)}
        expected.add(("tool_post", call.id, 0))
        if result.is_error:  # the no-op reflector's verdict on a failed attempt
            expected.add(("recovery_decision", call.id, 0))
    present = Counter((e.kind, e.tool_call_id, e.attempt) for e in events)
    missing = expected - set(present)
    seqs = [e.seq for e in events]
    gaps = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
    duplicated = sum(n - 1 for n in present.values()) + len(set(present) - expected)
    if missing:
        problems.append(f"{outcome.turn_id}: missing events {sorted(map(str, missing))}")
    if gaps:
        problems.append(f"{outcome.turn_id}: seq gaps {gaps}")
    if duplicated:
        extra = {k: n for k, n in present.items() if n > 1 or k not in expected}
        problems.append(f"{outcome.turn_id}: duplicated or unexpected events {extra}")
    return len(missing) + len(gaps), duplicated, problems


@dataclass
class Reruns:
    """How often tool bodies ran more than once for one call, and why."""

    extra_starts: int = 0
    """Body starts beyond the first, per call."""
    after_killed_body: int = 0
    """... after the earlier body was killed mid-run (its worker SIGKILLed)."""
    killed_before_commit: int = 0
    """... after the earlier body ended and its worker was killed right after (within
    ``COMMIT_WINDOW_S``), before the outcome could be committed."""
    after_finished_body: int = 0
    """... after the earlier body ended and its worker lived on: its outcome should have been
    committed (for an idempotent tool, a double execution)."""
    without_kill: int = 0
    """... although the earlier body's worker was never killed."""
    suspicious: list[list[BodyRun]] = field(default_factory=list)
    """The runs of each call of the last two kinds."""
    before_commit: list[list[BodyRun]] = field(default_factory=list)
    """The runs of each call killed between the body's end and the commit."""


COMMIT_WINDOW_S = 0.5


def reruns(runs: list[BodyRun], turn_ids: set[str], killed_at: dict[int, float]) -> Reruns:
    """Count the re-executions of one tool's bodies, per (turn, call), by their cause."""
    by_call: dict[tuple[str, str], list[BodyRun]] = {}
    for run in runs:
        if run.turn_id in turn_ids:
            by_call.setdefault((run.turn_id, run.label), []).append(run)
    found = Reruns()
    for call_runs in by_call.values():
        starts = [r for r in call_runs if r.phase == "start"]
        suspicious = False
        for earlier in starts[:-1]:
            found.extra_starts += 1
            end = next((r for r in call_runs if r.phase == "end" and r.pid == earlier.pid), None)
            killed = killed_at.get(earlier.pid)
            if killed is None:
                found.without_kill += 1
                suspicious = True
            elif end is None:
                found.after_killed_body += 1
            elif killed - end.at <= COMMIT_WINDOW_S:
                found.killed_before_commit += 1
                found.before_commit.append(call_runs)
            else:
                found.after_finished_body += 1
                suspicious = True
        if suspicious:
            found.suspicious.append(call_runs)
    return found


async def pending(tt: Tooltrail, outcome: TurnOutcome) -> str:
    """What an unfinished turn is waiting for (its pending activities)."""
    try:
        described = await tt.get_turn(outcome.turn_id).workflow_handle.describe()
    except Exception as exc:
        return f"describe failed: {exc}"
    found = []
    for activity in described.raw_description.pending_activities:
        failure = activity.last_failure.message if activity.HasField("last_failure") else ""
        found.append(
            f"{activity.activity_type.name} attempt {activity.attempt} "
            f"state {activity.state} {failure!r}"
        )
    return "pending: " + ("; ".join(found) or "no activity (a workflow task?)")


async def run_turn(
    tt: Tooltrail, outcome: TurnOutcome, permits: asyncio.Semaphore, deadline: float
) -> None:
    """Start one turn and wait for it (until the deadline)."""
    async with permits:
        try:
            handle = await tt.start_turn(
                outcome.calls,
                session_id=f"faults-{outcome.turn_id}",
                turn_id=outcome.turn_id,
                # A lost worker is noticed within 2 s; kills never exhaust the retries.
                config=RunConfig(heartbeat_timeout_s=2, infrastructure_retries=50),
            )
            started = time.monotonic()
            turn = await asyncio.wait_for(
                handle.result(), timeout=max(1.0, deadline - time.monotonic())
            )
            outcome.seconds = time.monotonic() - started
            outcome.results = turn.results
        except TimeoutError:
            outcome.error = f"not finished before the time limit; {await pending(tt, outcome)}"
        except Exception as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"


async def run(options: Options, directory: Path) -> int:
    """Run the bench on the chosen database (a throwaway PostgreSQL with ``--postgres``)."""
    if not options.postgres:
        return await bench(options, directory)
    async with throwaway_postgres() as postgres:
        options.database_url = postgres.url
        return await bench(options, directory, postgres if options.outages else None)


async def bench(options: Options, directory: Path, postgres: Any = None) -> int:
    """Run the turns under chaos; print the report; return the exit status."""
    rng = random.Random(options.seed)
    os.environ[FAULT_DIR_ENV] = str(directory)
    os.environ[LEASE_ENV] = str(options.lease_s)  # read by the worker processes
    url = options.database_url or f"sqlite:///{directory / 'audit.db'}"
    await upgrade(url)
    started = time.monotonic()
    deadline = started + options.time_limit_s
    env = await start_dev_server()
    store = AuditStore(url)
    address = env.client.service_client.config.target_host
    pool = WorkerPool(address, f"faults-{uuid.uuid4()}", url, directory, options.time_limit_s + 120)
    chaos = Chaos()
    stop = asyncio.Event()
    outcomes = [make_turn(rng, options) for _ in range(options.turns)]
    try:
        for _ in range(options.workers):
            await pool.add(chaos)
        tt = Tooltrail(env.client, fault_tools.host, task_queue=pool.task_queue, store=store)
        chaos_task = asyncio.create_task(chaos_loop(pool, options, rng, stop, chaos))
        outages = Outages()
        outage_task = (
            None
            if postgres is None
            else asyncio.create_task(
                outage_loop(postgres, random.Random(rng.random()), stop, outages)
            )
        )
        permits = asyncio.Semaphore(options.concurrency)
        try:
            await asyncio.gather(*(run_turn(tt, o, permits, deadline) for o in outcomes))
        finally:
            stop.set()
            await chaos_task
            if outage_task is not None:
                await outage_task
        elapsed = time.monotonic() - started
        return await summarize(tt, outcomes, chaos, options, directory, elapsed, outages)
    finally:
        await pool.close()
        await store.close()
        await env.shutdown()


def timeline(call_runs: list[BodyRun], chaos: Chaos) -> str:
    """One call's body runs and the kills of their workers, in seconds from the first run."""
    t0 = call_runs[0].at
    entries = [(r.at, f"{r.phase} pid {r.pid}") for r in call_runs]
    entries += [
        (at, f"kill pid {pid}")
        for pid, at in chaos.killed_at.items()
        if any(r.pid == pid for r in call_runs)
    ]
    shown = ", ".join(f"{at - t0:+.3f} s {what}" for at, what in sorted(entries))
    return f"  {call_runs[0].turn_id} {call_runs[0].label}: {shown}"


def dispatch_statuses(events: list[AuditEvent]) -> Counter[str]:
    """The dispatcher's status of each ``tool_post`` (``ok``, ``cache_hit``, ...)."""
    statuses: Counter[str] = Counter()
    for event in events:
        dispatch = event.payload.get("dispatch") if event.kind == "tool_post" else None
        if isinstance(dispatch, dict):
            statuses[str(dispatch.get("status"))] += 1
    return statuses


async def summarize(
    tt: Tooltrail,
    outcomes: list[TurnOutcome],
    chaos: Chaos,
    options: Options,
    directory: Path,
    elapsed: float,
    outages: Outages | None = None,
) -> int:
    """Check every turn against its audit trail and the tools' logs; print the table."""
    problems: list[str] = []
    completed = lost = duplicated = wrong = 0
    statuses: Counter[str] = Counter()
    for outcome in outcomes:
        if outcome.results is None:
            problems.append(f"{outcome.turn_id}: {outcome.error}")
            continue
        outputs = [r.output for r in outcome.results]
        if outputs != [expected_output(c) for c in outcome.calls]:
            wrong += 1
            problems.append(f"{outcome.turn_id}: unexpected results {outputs}")
        record = await tt.store.turn(outcome.turn_id)
        if record is None or record.status != "completed":
            problems.append(f"{outcome.turn_id}: turn row {record and record.status}")
        else:
            completed += 1
        events = await tt.audit(outcome.turn_id)
        turn_lost, turn_duplicated, found = audit_faults(outcome, events)
        lost += turn_lost
        duplicated += turn_duplicated
        problems += found
        statuses += dispatch_statuses(events)
    turn_ids = {o.turn_id for o in outcomes}
    charges = fault_tools.runs("charge", directory)
    charge = reruns(charges, turn_ids, chaos.killed_at)
    slow = reruns(fault_tools.runs("slow", directory), turn_ids, chaos.killed_at)
    big = reruns(fault_tools.runs("big", directory), turn_ids, chaos.killed_at)
    blocking = reruns(fault_tools.runs("blocking", directory), turn_ids, chaos.killed_at)
    # Not idempotent, so a lost worker's body runs again (at least once); but a body that
    # finished on a live worker, or ran twice with no kill, ran twice because of tooltrail.
    big_twice = big.after_finished_body + big.without_kill
    blocking_twice = blocking.after_finished_body + blocking.without_kill
    keys_wired = any(r.key is not None for r in charges if r.turn_id in turn_ids)
    charge_calls = sum(c.name == "charge" for o in outcomes for c in o.calls)
    lease = f"{options.lease_s:g} s" if options.lease_s > 0 else "default 60 s"
    # An idempotent body must not run again once it finished (unless its worker died before
    # the outcome was committed), nor while its first run's worker lives.
    double = charge.after_finished_body + charge.without_kill

    table = Table(title=f"faults: {options.turns} turns, seed {options.seed}", title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    rows: list[tuple[str, object]] = [
        ("turns completed", f"{completed}/{options.turns}"),
        ("calls (charge / all)", f"{charge_calls}/{sum(len(o.calls) for o in outcomes)}"),
        ("turns with wrong or missing results", wrong),
        ("audit events lost", lost),
        ("audit events duplicated", duplicated),
        ("workers killed (of them in a tool body)", f"{chaos.kills} ({chaos.kills_in_body})"),
        ("workers restarted", chaos.restarts),
    ]
    if keys_wired:
        rows += [
            ("idempotent double executions (charge)", double),
            ("charge re-runs after its worker died (at least once):", charge.extra_starts - double),
            (
                f"  body killed mid-run, taken over after the {lease} lease",
                charge.after_killed_body,
            ),
            ("  killed between the body's end and the commit", charge.killed_before_commit),
            ("retries served from the idempotency cache", statuses["cache_hit"]),
        ]
    else:
        rows += [
            ("at-least-once re-executions of charge (no idempotency key)", charge.extra_starts),
            ("  of them after a finished body", charge.after_finished_body),
        ]
    rows += [
        ("at-least-once re-executions of slow (not idempotent)", slow.extra_starts),
        ("  of them with no kill to explain them", slow.without_kill),
        ("big (300 KB outputs) run twice by tooltrail itself", big_twice),
        ("  big re-runs after its worker died mid-body", big.after_killed_body),
        ("blocking async bodies run twice by tooltrail itself", blocking_twice),
        ("  blocking re-runs after its worker died mid-body", blocking.after_killed_body),
    ]
    if outages is not None and outages.count:
        rows.append(("database outages (total s)", f"{outages.count} ({outages.seconds:.1f})"))
    durations = sorted(o.seconds for o in outcomes if o.seconds is not None)
    if durations:
        median = durations[len(durations) // 2]
        rows.append(("turn time median / max (s)", f"{median:.1f} / {durations[-1]:.1f}"))
    rows.append(("wall time (s)", f"{elapsed:.1f}"))
    for what, count in rows:
        table.add_row(what, str(count))
    console.print(table)
    if not keys_wired:
        console.print(
            "note: ctx.idempotency_key was None in every charge run: @tool(idempotent=True) "
            "has no effect here, so charge re-executions are at-least-once."
        )
    elif double:
        problems.append(f"{double} idempotent double execution(s) of charge:")
        problems += [timeline(call_runs, chaos) for call_runs in charge.suspicious]
    for call_runs in charge.before_commit:
        print(f"killed between end and commit: {timeline(call_runs, chaos)}")
    for problem in problems[:50]:
        console.print(f"[red]problem[/]: {problem}")
    for name, twice, found in (("big", big_twice, big), ("blocking", blocking_twice, blocking)):
        if twice:
            problems.append(f"{twice} body(ies) of {name} ran twice with no lost worker:")
            problems += [timeline(call_runs, chaos) for call_runs in found.suspicious]
    failed = (
        completed != options.turns
        or wrong
        or lost
        or duplicated
        or (keys_wired and double)
        or big_twice
        or blocking_twice
    )
    return 1 if failed else 0


def parse(argv: list[str] | None = None) -> Options:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--turns", type=int, default=20, help="turns to run (default 20)")
    parser.add_argument("--calls-min", type=int, default=3)
    parser.add_argument("--calls-max", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=3, help="turns at once (default 3)")
    parser.add_argument("--kill-every-min", type=float, default=2.0, dest="kill_every_min_s")
    parser.add_argument("--kill-every-max", type=float, default=5.0, dest="kill_every_max_s")
    parser.add_argument(
        "--time-limit", type=float, default=170.0, dest="time_limit_s", help="seconds"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--lease",
        type=float,
        default=5.0,
        dest="lease_s",
        help="idempotency lease of charge in seconds (default 5; 0: idempotent=True, 60 s)",
    )
    database = parser.add_mutually_exclusive_group()
    database.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    database.add_argument(
        "--postgres", action="store_true", help="a throwaway PostgreSQL server of the bench's own"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs' temporary directory")
    parser.add_argument(
        "--outages",
        action="store_true",
        help="with --postgres: stop the database for 1-3 s every 6-12 s as well",
    )
    args: dict[str, Any] = vars(parser.parse_args(argv))
    if args["seed"] is None:
        args["seed"] = random.SystemRandom().randrange(1_000_000)
    options = Options(**args)
    if not 1 <= options.calls_min <= options.calls_max:
        parser.error("need 1 <= --calls-min <= --calls-max")
    if options.turns < 1 or options.workers < 1 or options.concurrency < 1:
        parser.error("--turns, --workers and --concurrency must be at least 1")
    if options.outages and not options.postgres:
        parser.error("--outages needs --postgres (a server the bench may stop)")
    if not 0 < options.kill_every_min_s <= options.kill_every_max_s:
        parser.error("need 0 < --kill-every-min <= --kill-every-max")
    return options


def main(argv: list[str] | None = None) -> int:
    """Run the bench in a temporary directory."""
    options = parse(argv)
    directory = Path(tempfile.mkdtemp(prefix="tooltrail-faults-"))
    try:
        return asyncio.run(run(options, directory))
    finally:
        if options.keep:
            console.print(f"logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: the SDK's runtime threads may abort it (NOTES.md).
    os._exit(status)
