"""A tooltrail worker in its own process, for crash tests.

Usage: ``python crash_worker.py ADDRESS TASK_QUEUE DATABASE_URL HOST``, where HOST is a key
of ``crash_tools.HOSTS``. Prints ``ready`` once it polls."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta


async def main(address: str, task_queue: str, database_url: str, host_name: str) -> None:
    from tests.support.crash_tools import HOSTS
    from tooltrail.db.store import AuditStore
    from tooltrail.runtime.worker import build_worker, connect_client

    client = await connect_client(address)
    store = AuditStore(database_url)
    # A dead worker's sticky queue holds the next workflow task until this timeout (10 s by
    # default) before Temporal hands it to the shared queue; keep the tests quick.
    async with build_worker(
        client,
        HOSTS[host_name],
        task_queue=task_queue,
        store=store,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
