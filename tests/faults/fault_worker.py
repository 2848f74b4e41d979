"""A tooltrail worker in its own process, for the fault tests and ``bench.faults``.

Usage: ``python -m tests.faults.fault_worker ADDRESS TASK_QUEUE DATABASE_URL [LIFETIME_S]``.
Prints ``ready`` once it polls. It exits by itself after LIFETIME_S (default 300 s), so a
worker orphaned by a crashed test run does not live on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from datetime import timedelta


async def main(address: str, task_queue: str, database_url: str, lifetime_s: float) -> None:
    from tests.faults.fault_tools import worker_host
    from tooltrail.db.store import AuditStore
    from tooltrail.runtime.worker import build_worker, connect_client

    client = await connect_client(address)
    store = AuditStore(database_url)
    # A dead worker's sticky queue holds the next workflow task until this timeout (10 s by
    # default) before Temporal hands it to the shared queue; keep the tests quick.
    async with build_worker(
        client,
        worker_host(),
        task_queue=task_queue,
        store=store,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=1),
    ):
        print("ready", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=lifetime_s)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], float(args[3]) if len(args) > 3 else 300.0))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter finalisation: the SDK's runtime threads may abort it
