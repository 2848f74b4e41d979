"""Workers with different tool sets on one task queue: detect them and say so loudly.

Every tooltrail worker polls with an identity that carries its registry's fingerprint
(``... tooltrail:<fingerprint>``). Temporal lists a task queue's recent pollers with their
identities (``DescribeTaskQueue``), so any worker can see a peer whose tools differ from its
own: a turn landing there would answer calls of a tool it lacks with "Tool not found". The
worker logs a warning at start and then periodically while such a peer polls.

This is detection only (README "Production": all workers of a queue run the same tools);
keeping the work of different registries apart is not done yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterable

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

__all__ = [
    "IDENTITY_MARK",
    "mismatched_pollers",
    "registry_fingerprint",
    "watch_registry_peers",
    "worker_identity",
]

logger = logging.getLogger("tooltrail.registry_check")

IDENTITY_MARK = " tooltrail:"
"""What precedes the registry fingerprint in a worker's identity."""


def registry_fingerprint(names: Iterable[str]) -> str:
    """A short digest of a registry's tool names (order does not matter)."""
    joined = "\n".join(sorted(set(names)))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:12]


def worker_identity(fingerprint: str) -> str:
    """The worker identity: Temporal's usual ``pid@host`` plus the registry fingerprint."""
    return f"{os.getpid()}@{socket.gethostname()}{IDENTITY_MARK}{fingerprint}"


async def mismatched_pollers(client: Client, task_queue: str, fingerprint: str) -> list[str]:
    """Identities of the queue's recent pollers that serve another registry (sorted).

    Pollers without a fingerprint (not tooltrail workers, or older ones) are not counted.
    """
    seen: set[str] = set()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW):
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=kind,
            )
        )
        for poller in described.pollers:
            _, mark, theirs = poller.identity.rpartition(IDENTITY_MARK)
            if mark and theirs != fingerprint:
                seen.add(poller.identity)
    return sorted(seen)


@contextlib.asynccontextmanager
async def watch_registry_peers(
    client: Client,
    task_queue: str,
    fingerprint: str,
    tools: Iterable[str],
    *,
    interval_s: float = 30.0,
) -> AsyncIterator[asyncio.Task[None]]:
    """Warn (log level WARNING) while peers with another registry poll the queue."""
    names = ", ".join(sorted(tools)) or "(none)"

    async def watch() -> None:
        warned: set[str] = set()
        while True:
            try:
                peers = await mismatched_pollers(client, task_queue, fingerprint)
            except RPCError as exc:  # best-effort: a describe that fails only skips a check
                logger.debug("cannot describe task queue %s: %s", task_queue, exc.message)
                peers = []
            new = [peer for peer in peers if peer not in warned]
            if new:
                logger.warning(
                    "WORKERS WITH DIFFERENT TOOLS SHARE TASK QUEUE %r: this worker "
                    "(registry %s: %s) polls beside %s. A turn that lands on a worker "
                    "without one of its tools answers its calls 'Tool not found'. Run "
                    "every worker of a queue with the same --tools (or give each tool set "
                    "its own --task-queue).",
                    task_queue,
                    fingerprint,
                    names,
                    ", ".join(new),
                )
                warned.update(new)
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(watch(), name="tooltrail-registry-peers")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
