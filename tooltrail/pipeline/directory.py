"""Workers with different tool sets on one task queue: keep their work apart, say so loudly.

Every tooltrail worker polls with an identity that carries its registry's fingerprint
(``... tooltrail:<fingerprint>``). Temporal lists a task queue's recent pollers with their
identities (``DescribeTaskQueue``), so any worker can see a peer whose tools differ from its
own; the worker logs a warning at start and then periodically while such a peer polls.

Their work is kept apart (issue 20 item 5): no call is answered "Tool not found" because it
landed on a worker that lacks a tool another worker of the queue has.

- Every worker publishes its registry (tool names and settings) in the ``tool_registry``
  table (``RegistryDirectory``: at start, then every 30 s) and also polls an activity-only
  queue of its own, ``tools_queue(task_queue, fingerprint)``, for tool attempts only.
- A tool attempt that lands on a worker without its tool asks the directory (cached a few
  seconds) for a live peer that has it: published recently and polling its tools queue. If
  there is one, the attempt is refused with a non-retryable ``ApplicationError`` of type
  ``TOOL_ON_PEER`` naming that queue, before any hook, breaker gate or record; the turn
  (``tooltrail.workflows.routes``) sends the same attempt there and sends the tool's later
  calls of the turn there directly. If no live worker has it, the ordinary "Tool not found".
- A standalone turn that advertises "the worker's tools" advertises the union of the
  queue's live registries (``RegistryDirectory.peer_tools``).
- An agent's model is offered the union too: each registry's row carries its tools' catalog
  entries (the function specs a model is offered), and the model activity adds the live
  peers' entries to its own worker's (``RegistryDirectory.peer_offer``), so whichever
  worker runs a model call, the model sees the same tools; its plan advertises the same
  union, so a call of a peer's tool is sent to the peer.

While all the workers of a queue run the same tools, nothing of this is used: attempts stay
on the main queue (eager dispatch included), and the directory (read at most every few
seconds per worker) names no peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

from tooltrail.core.proofs import check_row_mac, row_mac, tie_break
from tooltrail.core.text import canonical_json
from tooltrail.core.wire import TOOL_ON_PEER
from tooltrail.db.registry import (
    PublishedRegistry,
    catalog_text,
    publish_approvers,
    publish_registry,
    read_approvers,
    read_registries,
)
from tooltrail.db.store import AuditStore
from tooltrail.settings import Settings

__all__ = [
    "IDENTITY_MARK",
    "TOOL_ON_PEER",
    "PeerOffer",
    "RegistryDirectory",
    "mismatched_pollers",
    "registry_fingerprint",
    "tools_queue",
    "watch_registry_peers",
    "worker_identity",
]

logger = logging.getLogger("tooltrail.registry_check")

IDENTITY_MARK = " tooltrail:"
"""What precedes the registry fingerprint in a worker's identity."""


PUBLISH_DEADLINE_S = 5.0
"""How long one publication of the registry may take before it is given up (and logged)."""
PUBLISH_INTERVAL_S = 30.0
"""How often a worker refreshes its row in the directory."""


READ_DEADLINE_S = 2.0
"""How long a read of the directory may take before it counts as empty."""
PEER_OFFER_DEADLINE_S = 2 * READ_DEADLINE_S
"""How long ``RegistryDirectory.peer_offer`` may take in all (the directory's read, then the
peers' tools queues) before it counts as empty: the turn goes on with this worker's tools."""


class PeerOffer(NamedTuple):
    """What the queue's live peers add to this worker's tools (``RegistryDirectory.peer_offer``)."""

    tools: dict[str, dict[str, Any]]
    """The tools of live peers this worker lacks, each with its settings (``ToolMeta`` JSON)."""
    catalog: list[dict[str, Any]]
    """Their catalog entries (OpenAI's ``tools`` format), sorted by tool name."""


def tools_queue(task_queue: str, fingerprint: str) -> str:
    """The activity-only queue of the workers of ``task_queue`` with registry ``fingerprint``."""
    return f"{task_queue}/tools-{fingerprint}"


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
    """Warn (log level WARNING) while peers with another registry poll the queue.

    The work of different registries is kept apart (``RegistryDirectory``); the warning stays,
    because every call of a peer's tool then costs a refused attempt before it is sent on.
    """
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
                    "(registry %s: %s) polls beside %s. Calls of a tool that lands on a worker "
                    "without it are sent on to a worker that has it (one refused attempt "
                    "each, then the turn sends the tool's calls there directly). Run every "
                    "worker of a queue with the same --tools (or give each tool set its own "
                    "--task-queue) to avoid the detour.",
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


class RegistryDirectory:
    """One worker's view of the registries of its task queue (the ``tool_registry`` table).

    Args:
        client: the worker's Temporal client (to see which tools queues have pollers).
        store: the audit database.
        task_queue: the worker's main task queue.
        tools: this worker's tools, each with its settings as JSON (``ToolMeta``).
        ttl_s: how long a read of the directory or of a queue's pollers is reused.
        stale_s: a registry not refreshed for this long counts as gone.
        catalog: builds this worker's catalog entries (OpenAI's ``tools`` format), published
            with the tools so peers can offer them to a model; called once, at the first
            publication (default: none published).
        keys: the workers' shared keys (``tooltrail.core.proofs``): this worker's rows carry
            its MAC, and a peer's row counts only with a valid one (default: the settings';
            with none, no peer counts and nothing is routed).
        approvers: ``approvers_fingerprint`` of this worker's approver set, published with
            its identity so the workers of the queue can tell that they agree.
        identity: this worker's Temporal identity (its approver row's key).
    """

    def __init__(
        self,
        client: Client,
        store: AuditStore,
        task_queue: str,
        tools: dict[str, dict[str, Any]],
        *,
        ttl_s: float = 5.0,
        stale_s: float = 3 * PUBLISH_INTERVAL_S,
        catalog: Callable[[], list[dict[str, Any]]] | None = None,
        keys: Mapping[str, bytes] | None = None,
        approvers: str = "",
        identity: str = "",
    ) -> None:
        """Describe this worker's registry; nothing is read or written yet."""
        self.keys = dict(Settings().worker_key_ring() if keys is None else keys)
        self.approvers = approvers
        self.identity = identity
        # Two workers of one process share a Temporal identity: each row is its own.
        self._instance = uuid.uuid4().hex[:8]
        self._ignored: set[str] = set()
        self.client = client
        self.store = store
        self.task_queue = task_queue
        self.tools = tools
        self.fingerprint = registry_fingerprint(tools)
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self._build_catalog = catalog
        self._catalog: list[dict[str, Any]] | None = None
        self._peers: tuple[float, dict[str, PublishedRegistry]] | None = None
        self._live: dict[str, tuple[float, bool]] = {}

    @property
    def own_queue(self) -> str:
        """This worker's tools queue."""
        return tools_queue(self.task_queue, self.fingerprint)

    async def publish(self) -> None:
        """Insert or refresh this registry's row (best effort: a failure is logged)."""
        if self._catalog is None:
            try:
                build = self._build_catalog
                self._catalog = [] if build is None else build()
            except Exception:
                # The tools are still published (their calls can be routed here); only no
                # peer's model is offered them.
                logger.warning("cannot build the tool catalog to publish", exc_info=True)
                self._catalog = []
        now = datetime.now(UTC)
        try:
            # Bounded: a worker starts (and its turns run) while the database hangs.
            async with asyncio.timeout(PUBLISH_DEADLINE_S):
                await publish_registry(
                    self.store,
                    task_queue=self.task_queue,
                    fingerprint=self.fingerprint,
                    tools=self.tools,
                    catalog=self._catalog,
                    now=now,
                    mac=row_mac(
                        self.keys,
                        *self._row_fields(
                            self.fingerprint, self.tools, catalog_text(self._catalog)
                        ),
                    ),
                )
                if self.identity:
                    await publish_approvers(
                        self.store,
                        task_queue=self.task_queue,
                        worker=self._worker_key,
                        approvers=self.approvers,
                        mac=row_mac(
                            self.keys, *self._approver_fields(self._worker_key, self.approvers)
                        ),
                        now=now,
                    )
        except Exception:
            logger.warning(
                "cannot publish the registry of task queue %r; peers may not route to it",
                self.task_queue,
                exc_info=True,
            )

    async def keep_published(self, interval_s: float = PUBLISH_INTERVAL_S) -> None:
        """Refresh the row every ``interval_s`` until cancelled (``publish`` comes first)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.publish()

    async def peers(self) -> dict[str, dict[str, Any]]:
        """The other registries of the queue published recently: tools by fingerprint."""
        return {fingerprint: found.tools for fingerprint, found in (await self._read()).items()}

    async def _read(self) -> dict[str, PublishedRegistry]:
        """The other registries of the queue published recently, by fingerprint (cached)."""
        now = time.monotonic()
        if self._peers is not None and now - self._peers[0] < self.ttl_s:
            return self._peers[1]
        try:
            # Bounded: a turn's start must not wait on a database that does not answer.
            found = await asyncio.wait_for(
                read_registries(
                    self.store,
                    task_queue=self.task_queue,
                    seen_since=datetime.now(UTC) - timedelta(seconds=self.stale_s),
                ),
                READ_DEADLINE_S,
            )
        except Exception:
            logger.warning("cannot read the registries of %r", self.task_queue, exc_info=True)
            found = {}
        found.pop(self.fingerprint, None)
        found = {fp: registry for fp, registry in found.items() if self._authentic(fp, registry)}
        self._peers = (now, found)
        return found

    def _row_fields(self, fingerprint: str, tools: dict[str, Any], catalog: str) -> tuple[str, ...]:
        return ("registry", self.task_queue, fingerprint, canonical_json(tools), catalog)

    @property
    def _worker_key(self) -> str:
        """This worker's approver row: its identity and instance."""
        return f"{self.identity} #{self._instance}"

    def _approver_fields(self, worker: str, approvers: str) -> tuple[str, ...]:
        return ("approvers", self.task_queue, worker, approvers)

    def _authentic(self, fingerprint: str, registry: PublishedRegistry) -> bool:
        """Whether a peer's row was published by a worker holding the key, as it stands.

        A row written in SQL (a forged peer that would receive a tool's routed calls with
        their arguments, and answer them) has no valid MAC; nor has one of a worker with
        another key. Either is ignored, and said once.
        """
        try:
            fields = self._row_fields(fingerprint, registry.tools, registry.catalog_text)
        except ValueError:
            fields = ()
        if (
            fields
            and registry_fingerprint(registry.tools) == fingerprint
            and check_row_mac(self.keys, registry.mac, *fields)
        ):
            return True
        if fingerprint not in self._ignored:
            self._ignored.add(fingerprint)
            logger.warning(
                "IGNORING THE REGISTRY ROW %s OF TASK QUEUE %r: %s. No call is routed to it.",
                fingerprint,
                self.task_queue,
                "this worker holds no worker key (TOOLTRAIL_WORKER_KEY) to check it with"
                if not self.keys
                else "its MAC does not verify with this worker's keys (a worker with another "
                "TOOLTRAIL_WORKER_KEY, or a row written in the database)",
            )
        return False

    async def approver_conflicts(self) -> list[str]:
        """The live workers of the queue whose approver set differs from this worker's.

        Each as ``identity (approvers fingerprint or 'none')``; rows without a valid MAC do
        not count. Empty when the database cannot be read in time (logged).
        """
        try:
            rows = await asyncio.wait_for(
                read_approvers(
                    self.store,
                    task_queue=self.task_queue,
                    seen_since=datetime.now(UTC) - timedelta(seconds=self.stale_s),
                ),
                READ_DEADLINE_S,
            )
        except Exception:
            logger.warning("cannot read the approver sets of %r", self.task_queue, exc_info=True)
            return []
        return sorted(
            f"{row.worker} ({row.approvers or 'none'})"
            for row in rows
            if row.worker != self._worker_key
            and row.approvers != self.approvers
            and check_row_mac(self.keys, row.mac, *self._approver_fields(row.worker, row.approvers))
        )

    async def live(self, fingerprint: str) -> bool:
        """Whether a worker of registry ``fingerprint`` polls its tools queue (cached)."""
        now = time.monotonic()
        cached = self._live.get(fingerprint)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        try:
            described = await self.client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self.client.namespace,
                    task_queue=TaskQueue(name=tools_queue(self.task_queue, fingerprint)),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                ),
                timeout=timedelta(seconds=READ_DEADLINE_S),
            )
        except RPCError as exc:
            logger.debug("cannot describe the tools queue of %s: %s", fingerprint, exc.message)
            return False
        # Long polls refresh a poller's last access about every minute; older is gone.
        horizon = datetime.now(UTC) - timedelta(seconds=self.stale_s)
        alive = any(
            poller.last_access_time.ToDatetime(tzinfo=UTC) >= horizon
            for poller in described.pollers
        )
        self._live[fingerprint] = (now, alive)
        return alive

    async def peer_queue_for(self, tool_name: str) -> tuple[str, list[str]] | None:
        """A live peer that has ``tool_name``: its tools queue and tool names.

        ``None``: no live worker of the queue has the tool.
        """
        # Peers in an order none of them can choose (a keyed digest, not the fingerprint, which
        # a peer picks with its tool set): a padded registry does not take every routed call.
        peers = sorted(
            (await self.peers()).items(),
            key=lambda item: tie_break(self.keys, tool_name, item[0]),
        )
        for fingerprint, tools in peers:
            if tool_name in tools and await self.live(fingerprint):
                return tools_queue(self.task_queue, fingerprint), sorted(tools)
        return None

    async def peer_tools(self) -> dict[str, dict[str, Any]]:
        """The tools of live peers that this worker lacks, each with its settings."""
        return (await self.peer_offer()).tools

    async def peer_offer(self) -> PeerOffer:
        """The tools of live peers that this worker lacks: their settings and catalog entries.

        This worker's own tools win a name clash; between peers, the registry with the
        lowest fingerprint does (the same choice on every worker). A tool a peer published
        without a catalog entry is still offered to plans (its calls are sent to the peer),
        but to no model. Bounded in all (``PEER_OFFER_DEADLINE_S``) and never failing: with
        the database or the server slow or down, nothing is added (and that is logged), so
        a turn's plan, a model call and the catalog go on with this worker's own tools.
        """
        try:
            return await asyncio.wait_for(self._peer_offer(), PEER_OFFER_DEADLINE_S)
        except Exception:
            logger.warning(
                "cannot read the tools of the peers of task queue %r in time; this worker's "
                "own tools only",
                self.task_queue,
                exc_info=True,
            )
            return PeerOffer({}, [])

    async def _peer_offer(self) -> PeerOffer:
        tools: dict[str, dict[str, Any]] = {}
        entries: dict[str, dict[str, Any]] = {}
        for fingerprint, registry in sorted((await self._read()).items()):
            missing = {n: meta for n, meta in registry.tools.items() if n not in self.tools}
            if not missing or not await self.live(fingerprint):
                continue
            for name, meta in missing.items():
                tools.setdefault(name, meta)
            for entry in registry.catalog:
                name = entry["function"]["name"]
                if name in missing and tools[name] is missing[name]:
                    entries.setdefault(name, entry)
        return PeerOffer(tools, [entries[name] for name in sorted(entries)])
