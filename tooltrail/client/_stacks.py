"""The two ways to get a ``Tooltrail``: ``local`` (everything in-process) and ``connect``.

``local`` starts the embedded Temporal dev server, a worker (stopped within a bound,
``_bounded``) and the database; ``connect`` opens an existing deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tooltrail.client._tooltrail import Tooltrail
from tooltrail.pipeline.directory import registry_fingerprint, watch_registry_peers
from tooltrail.pipeline.host import Host
from tooltrail.runtime.embedded import DEV_SERVER_ARGS, start_dev_server
from tooltrail.runtime.reconciler import background_reconciliation, host_redactors
from tooltrail.runtime.worker import build_worker, open_deployment, settings_client_options
from tooltrail.settings import Settings
from tooltrail.telemetry import ensure_configured
from tooltrail.tools import Tool, ToolRegistry
from tooltrail.tools.scratch import ScratchDirs

__all__ = ["connect", "local"]

log = logging.getLogger("tooltrail.client")


@contextlib.asynccontextmanager
async def local(
    host: Host | ToolRegistry | list[Tool],
    *,
    database_url: str | None = None,
    task_queue: str = "tooltrail",
    ui: bool = False,
    ui_port: int | None = None,
    port: int | None = None,
    server_db_filename: str | None = None,
    server_args: Sequence[str] = DEV_SERVER_ARGS,
    shutdown_timeout_s: float = 10.0,
    worker: bool = True,
) -> AsyncIterator[Tooltrail]:
    """Run everything in-process: the embedded Temporal dev server, a worker and the database.

    The database (the host's, ``database_url``, or the embedded SQLite file) is migrated on
    start. On exit the worker drains, session scratch directories are removed and the server
    stops.

    Args:
        host: the host wiring (or a registry, or a list of tools).
        database_url: the audit database (default: the host's, else the embedded SQLite file).
        task_queue: the task queue of the embedded worker.
        ui: whether to start the Temporal UI.
        ui_port: the UI's port (default: any free port).
        port: the Temporal frontend's port (default: any free port).
        server_db_filename: keep the server's state in this SQLite file (default: memory).
        server_args: the dev server's own arguments (default: tooltrail's tuning,
            ``DEV_SERVER_ARGS``; ``()`` runs it with Temporal's defaults).
        shutdown_timeout_s: how long the worker may take to stop on exit before it is
            cancelled (a turn whose final audit write is retrying against an unreachable
            database would otherwise hold it for ever; see ``_bounded``).
        worker: run the embedded worker; ``False``: only the server and the client, for
            workers started elsewhere (``tooltrail dev --no-worker``).
    """
    servers: list[WorkflowEnvironment] = []
    telemetry: list[Any] = []

    async def embedded_client(settings: Settings) -> Client:
        # Started once the database is migrated, so a bad database starts no server.
        # A worker runs here: its spans go to the OTEL_* exporters (unless the application
        # installed a tracer provider of its own).
        configured = ensure_configured(settings)
        if configured is not None:
            telemetry.append(configured)
        env = await start_dev_server(
            port=port,
            ui=ui,
            ui_port=ui_port,
            db_filename=server_db_filename,
            extra_args=server_args,
            startup_timeout_s=settings.embedded_startup_timeout_s,
        )
        servers.append(env)
        # The embedded server's client, with the configured codec and tracing.
        options = settings_client_options(settings)
        options.pop("api_key", None)
        options.pop("tls", None)
        return Client(
            env.client.service_client,
            namespace=env.client.namespace,
            data_converter=options["data_converter"],
            interceptors=options.get("interceptors", []),
        )

    try:
        async with open_deployment(
            host,
            task_queue=task_queue,
            database_url=database_url,
            migrate=True,
            client=embedded_client,
        ) as deployment:
            wired, client, store = deployment.host, deployment.client, deployment.store
            if worker and not wired.worker_key_ring():
                # The embedded stack's own worker key: its one worker makes and checks every
                # approval proof, so nothing needs setting up (workers started elsewhere
                # against this server need TOOLTRAIL_WORKER_KEY like any deployment's).
                wired.worker_keys = {"embedded": secrets.token_bytes(32)}
            scratch = ScratchDirs(wired.scratch_base, enabled=wired.managed_scratch)
            tt = Tooltrail(client, wired, task_queue=task_queue, store=store)
            try:
                async with contextlib.AsyncExitStack() as running:
                    if worker:
                        names = wired.registry.names()
                        for context in (
                            _bounded(
                                build_worker(
                                    client,
                                    wired,
                                    task_queue=task_queue,
                                    store=store,
                                    scratch=scratch,
                                ),
                                shutdown_timeout_s,
                            ),
                            background_reconciliation(
                                client,
                                store,
                                deployment.settings,
                                task_queue=task_queue,
                                redactors=host_redactors(wired),
                            ),
                            watch_registry_peers(
                                client, task_queue, registry_fingerprint(names), names
                            ),
                        ):
                            await running.enter_async_context(context)
                    yield tt
            finally:
                for session_id in tt.sessions:
                    scratch.remove(session_id)
    finally:
        for env in servers:
            await env.shutdown()
        for configured in telemetry:
            configured.flush()  # the providers are global: flushed, not shut down


@contextlib.asynccontextmanager
async def _bounded(running: Worker, timeout_s: float) -> AsyncIterator[Worker]:
    """Run a worker; on exit give its shutdown ``timeout_s``, then cancel it.

    A worker's shutdown waits for the workflow tasks it holds, and a turn's final audit write
    is a local activity that retries inside its workflow task until the database answers:
    with the database down, shutdown would wait for ever. Cancelled, the worker lets go of
    the task; the server hands it to the next worker of the queue, which replays the turn
    and writes its records then (with an embedded server in memory there is no next worker:
    the turn, its history and the unwritten records end with the process).
    """
    task = asyncio.create_task(running.run(), name="tooltrail-local-worker")
    try:
        yield running
    finally:
        stopping = asyncio.create_task(running.shutdown())
        done, _ = await asyncio.wait([stopping], timeout=timeout_s)
        if not done:
            log.warning(
                "the worker did not stop within %gs (a workflow task is still busy, e.g. an "
                "audit write retrying against an unreachable database); cancelling it",
                timeout_s,
            )
            for pending in (task, stopping):
                pending.cancel()
        await asyncio.wait([task, stopping])
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("the worker stopped with an error: %s", task.exception())


@contextlib.asynccontextmanager
async def connect(
    host: Host | ToolRegistry | list[Tool] | None = None,
    *,
    temporal_address: str | None = None,
    namespace: str | None = None,
    task_queue: str | None = None,
    database_url: str | None = None,
    learn_worker_tools: bool | None = None,
) -> AsyncIterator[Tooltrail]:
    """Connect to an existing deployment (workers run ``tooltrail worker``).

    The client needs no tools: the workers decide what they offer and how each call runs.
    ``host``, if given, serves ``authorize_tool`` and its ``database_url``. Options default
    to the settings (``TOOLTRAIL_*`` environment variables); ``learn_worker_tools`` (default:
    whether the settings list MCP servers) is ``Tooltrail``'s.

    Raises:
        DatabaseSchemaError: the database is not migrated (run ``tooltrail db upgrade``).
    """
    async with open_deployment(
        host,
        temporal_address=temporal_address,
        namespace=namespace,
        task_queue=task_queue,
        database_url=database_url,
    ) as deployment:
        yield Tooltrail(
            deployment.client,
            deployment.host,
            task_queue=deployment.task_queue,
            store=deployment.store,
            learn_worker_tools=(
                bool(deployment.settings.mcp_servers)
                if learn_worker_tools is None
                else learn_worker_tools
            ),
        )
