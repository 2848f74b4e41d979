"""``build_worker``: the one worker used by the CLI, the embedded stack and the tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from tooltrail.activities import (
    AuditActivities,
    RecoveryActivities,
    SessionActivities,
    ToolActivities,
)
from tooltrail.activities.approval_proof import ApprovalProofActivities
from tooltrail.activities.authorize import AuthorizeActivities
from tooltrail.activities.catalog import CatalogActivities
from tooltrail.activities.conversation import ConversationActivities
from tooltrail.activities.planning import TurnPlanner
from tooltrail.activities.recorder import Recorder
from tooltrail.core.proofs import approvers_fingerprint
from tooltrail.core.recovery import NoopReflector
from tooltrail.db.idempotency import SqlIdempotencyStore
from tooltrail.db.migrate import open_store
from tooltrail.db.sqlite_guard import claim_sqlite_file
from tooltrail.db.store import AuditStore
from tooltrail.errors import ConfigurationError
from tooltrail.pipeline.directory import (
    RegistryDirectory,
    registry_fingerprint,
    watch_registry_peers,
    worker_identity,
)
from tooltrail.pipeline.dispatcher import NullAuditLog, ToolDispatcher
from tooltrail.pipeline.host import Host
from tooltrail.pipeline.middleware import RedactingMiddleware
from tooltrail.runtime.clean_failures import CleanDatabaseErrors
from tooltrail.runtime.codec import codec_from_settings, data_converter
from tooltrail.runtime.converter import wire_data_converter
from tooltrail.runtime.reconciler import background_reconciliation, host_redactors
from tooltrail.runtime.versioning import deployment_config, mark_versioned_worker
from tooltrail.settings import Settings
from tooltrail.telemetry import tracing_interceptors
from tooltrail.tools import Tool, ToolRegistry
from tooltrail.tools.scratch import ScratchDirs
from tooltrail.workflows.agent import AgentRunWorkflow
from tooltrail.workflows.authorize import AuthorizeToolWorkflow
from tooltrail.workflows.catalog import ToolCatalogWorkflow
from tooltrail.workflows.session import CloseSessionWorkflow
from tooltrail.workflows.turn import TurnWorkflow
from tooltrail.workflows.versioned import VersionedAgentRunWorkflow

logger = logging.getLogger("tooltrail.worker")

__all__ = [
    "PURE_MODULES",
    "ClientFactory",
    "Deployment",
    "ToolWorker",
    "build_worker",
    "connect_client",
    "open_deployment",
    "sandbox_runner",
    "worker",
]

# What the sandbox shares with the worker instead of re-importing it for every workflow run:
# pydantic (expensive to import) and tooltrail's pure modules, exactly those that workflow
# code imports: no I/O, no clock, no randomness, no module state. tests/test_layers.py keeps
# this list equal to what the workflow modules import and checks that none of it loads
# SQLAlchemy, httpx, MCP or the OpenTelemetry SDK.
PURE_MODULES = ("tooltrail.core", "tooltrail.errors")
_PASSTHROUGH = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", *PURE_MODULES)
# tooltrail's own workflow modules. They are library code (users write tools, never workflow
# code), keep no module state, and are checked by replay tests: passing them through saves
# re-importing them for every workflow run (~5 ms a turn on this project's machine). The
# price: the sandbox no longer watches the calls they make, so the test suite and the
# replay checks run them strictly (re-imported, every call watched).
_WORKFLOW_MODULES = ("tooltrail.workflows",)


def sandbox_runner(*, strict: bool = False) -> SandboxedWorkflowRunner:
    """Return the workflow runner with tooltrail's sandbox passthrough.

    Args:
        strict: re-import tooltrail's workflow modules for every run, so the sandbox's
            restrictions apply to every call they make (slower; tests and replays).
    """
    modules = _PASSTHROUGH if strict else (*_PASSTHROUGH, *_WORKFLOW_MODULES)
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*modules)
    )


def build_worker(
    client: Client,
    host: Host,
    *,
    task_queue: str,
    store: AuditStore,
    scratch: ScratchDirs | None = None,
    strict_sandbox: bool = False,
    **worker_options: Any,
) -> Worker:
    """Build the worker of a tooltrail deployment; freezes the host's registry.

    Args:
        client: a Temporal client using tooltrail's data converter.
        host: the host wiring.
        task_queue: the task queue of the turn workflows.
        store: the audit database.
        scratch: session scratch directories (default: from the host).
        strict_sandbox: run the workflows under the sandbox's full watch (see
            ``sandbox_runner``); slower, for tests.
        **worker_options: passed to ``temporalio.worker.Worker``; the slots and the
            workflow cache default to the settings (``Settings.worker_options``). With a
            ``deployment_config`` (``tooltrail.runtime.versioning.deployment_config``) the worker
            polls as that deployment version: turns pinned, agent runs auto-upgrade.

    Raises:
        ConfigurationError: another worker process already uses the SQLite file of
            ``store`` (unless ``TOOLTRAIL_SQLITE_SHARED``).
    """
    if not Settings().sqlite_shared:
        # One worker process per SQLite file (tooltrail.db.sqlite_guard says why).
        claim_sqlite_file(store.url)
        store.worker_claims += 1
    scratch = scratch or ScratchDirs(host.scratch_base, enabled=host.managed_scratch)
    # No in-memory dispatch log: each dispatch record travels with its attempt's result
    # into the turn's SQL trail (one row per dispatch), so a worker keeps nothing per call.
    dispatcher = ToolDispatcher(
        host.registry,
        store=SqlIdempotencyStore(store),
        audit=NullAuditLog(),
        access=host.access,
        scratch=scratch,
    )
    # Identity and tools are fixed once the worker exists (spec: frozen registry and access).
    dispatcher.freeze()
    recorder = Recorder(
        store,
        host.observers,
        [layer for layer in host.middleware if isinstance(layer, RedactingMiddleware)],
    )
    # The queue's registries, so the work of workers with other tools stays apart
    # (tooltrail.pipeline.directory): published by this worker (names, settings, catalog
    # entries); read on a registry miss, by the plan of a turn that names no tools, by the
    # model turns (the model is offered the peers' tools too) and by the catalog activity.
    worker_keys = host.worker_key_ring()
    directory = RegistryDirectory(
        client,
        store,
        task_queue,
        {
            name: meta.model_dump(mode="json", exclude_defaults=True)
            for name, meta in host.tool_meta().items()
        },
        # Published with the tools, so a peer's model can be offered them too.
        catalog=host.registry.openai_tools,
        keys=worker_keys,
        approvers=approvers_fingerprint(host.approver_keys()),
    )
    identity = worker_options.pop("identity", None) or worker_identity(directory.fingerprint)
    directory.identity = identity
    if not worker_keys:
        logger.warning(
            "this worker holds no worker key (TOOLTRAIL_WORKER_KEY): the approvals of its "
            "interactive turns are refused (it could not prove them to the worker that runs "
            "the call) and no tool call is routed to a peer (their registry rows cannot be "
            "authenticated)"
        )
    tools = ToolActivities(
        host.registry,
        recorder,
        scratch,
        noop_reflector=type(host.reflector) is NoopReflector,
        hooks=host.hooks,
        hook_timeout_s=host.hook_timeout_s,
        middleware=host.middleware,
        breaker=host.circuit_breaker,
        dispatcher=dispatcher,
        # The identity Temporal knows the worker by.
        worker_identity=identity,
        directory=directory,
        worker_keys=worker_keys,
    )
    audit = AuditActivities(recorder)
    planner = TurnPlanner(host, store, directory)
    extra_activities: list[Any] = []
    if host.model is not None:
        conversation = ConversationActivities(
            host.model,
            recorder,
            planner,
            host.registry.openai_tools,
            directory=directory,
            prices=Settings().model_price_table(),
        )
        extra_activities.append(conversation.model_turn)
    sessions = SessionActivities(scratch)
    recovery = RecoveryActivities(host.reflector, host.registry)
    # A versioned worker runs agent runs as auto-upgrade (an unversioned one may not declare a
    # behaviour at all): tooltrail.runtime.versioning says what moves where.
    versioned = worker_options.get("deployment_config") is not None
    agent_run = VersionedAgentRunWorkflow if versioned else AgentRunWorkflow
    if versioned:
        mark_versioned_worker(client)
    interceptors = [CleanDatabaseErrors(), *worker_options.pop("interceptors", ())]
    # A versioned worker's tools queue is in its deployment version too: an attempt a pinned
    # turn routes goes to the peer of the same release.
    deployment = worker_options.get("deployment_config")
    routed_build = {"deployment_config": deployment} if deployment is not None else {}
    # Attempts sent here by peers that lack a tool of this worker: tool attempts only.
    routed = Worker(
        client,
        task_queue=directory.own_queue,
        activities=[tools.execute],
        interceptors=interceptors,
        identity=identity,
        graceful_shutdown_timeout=worker_options.get(
            "graceful_shutdown_timeout", timedelta(seconds=0)
        ),
        max_concurrent_activities=worker_options.get("max_concurrent_activities")
        or Settings().max_concurrent_activities,
        **routed_build,
    )
    return ToolWorker(
        client,
        routed=routed,
        directory=directory,
        task_queue=task_queue,
        workflows=[
            TurnWorkflow,
            CloseSessionWorkflow,
            agent_run,
            ToolCatalogWorkflow,
            AuthorizeToolWorkflow,
        ],
        activities=[
            tools.execute,
            audit.record,
            sessions.cleanup,
            recovery.reflect,
            planner.prepare,
            ApprovalProofActivities(store, worker_keys).prove,
            CatalogActivities(host, directory).catalog,
            AuthorizeActivities(dispatcher).authorize,
            *extra_activities,
        ],
        workflow_runner=sandbox_runner(strict=strict_sandbox),
        # Database errors leave activities without the data they were writing.
        interceptors=interceptors,
        # The identity carries the registry's fingerprint, so peers with other tools on this
        # queue can be told apart (tooltrail.pipeline.directory).
        identity=identity,
        **{**_capacity(worker_options), **worker_options},
    )


class ToolWorker(Worker):
    """The tooltrail worker: Temporal's, plus the queue of attempts peers send it.

    Running, it also polls its registry's tools queue (``tooltrail.pipeline.directory``) and
    keeps its registry published in the database; shutting down stops both.
    """

    def __init__(
        self,
        client: Client,
        *,
        routed: Worker,
        directory: RegistryDirectory,
        **options: Any,
    ) -> None:
        """Build the main worker; ``routed`` polls the tools queue of ``directory``."""
        super().__init__(client, **options)
        self.routed = routed
        self.directory = directory

    async def run(self) -> None:
        """Run both workers and the registry's publication until shut down."""
        await self.directory.publish()
        publishing = asyncio.create_task(self.directory.keep_published(), name="tooltrail-registry")
        routed = asyncio.create_task(self.routed.run(), name="tooltrail-tools-queue")
        try:
            await super().run()
        finally:
            publishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publishing
            await self.routed.shutdown()
            try:
                await routed
            except Exception:
                # The main worker's end is what the caller hears of; this one is logged.
                logger.exception("the tools queue's worker failed")

    async def shutdown(self) -> None:
        """Shut both workers down together (attempts get the same graceful timeout)."""
        await asyncio.gather(super().shutdown(), self.routed.shutdown())


def _capacity(worker_options: dict[str, Any]) -> dict[str, Any]:
    """The settings' slots and cache, unless the caller sizes the worker (or tunes it)."""
    if "tuner" in worker_options:
        # A tuner replaces the fixed slot counts; Temporal refuses both together.
        return {"max_cached_workflows": Settings().max_cached_workflows}
    return Settings().worker_options()


def settings_data_converter(settings: Settings) -> DataConverter:
    """Tooltrail's data converter, encrypting payloads when codec keys are configured.

    With keys, failure messages and stack traces are moved into an encrypted payload as well
    (Temporal's encoded failure attributes): an exception's text (a loop stop naming a call's
    arguments, say) is no more readable in the history than the arguments themselves. Every
    client, worker and replayer of a deployment builds its converter here.
    """
    codec = codec_from_settings(settings)
    if codec is None:
        return wire_data_converter
    return data_converter(codec, encode_failure_messages=True)


def settings_client_options(settings: Settings) -> dict[str, Any]:
    """``Client.connect`` options from the settings: converter, TLS/API key, tracing."""
    options: dict[str, Any] = {
        "data_converter": settings_data_converter(settings),
        **settings.temporal_connect_options(),
    }
    if settings.otel_enabled:
        # On the client only: a worker built on it inherits the interceptors (passing them
        # to the worker too would record every worker-side span twice).
        options["interceptors"] = tracing_interceptors()
    return options


async def connect_client(
    address: str,
    *,
    namespace: str = "default",
    data_converter: DataConverter | None = None,
    **kwargs: Any,
) -> Client:
    """Connect a Temporal client with tooltrail's data converter (or the one given).

    Raises:
        ConfigurationError: the server cannot be reached (with the address tried).
    """
    try:
        return await Client.connect(
            address,
            namespace=namespace,
            data_converter=data_converter or wire_data_converter,
            **kwargs,
        )
    except RuntimeError as exc:
        raise ConfigurationError(
            f"cannot reach Temporal at {address!r} (namespace {namespace!r}): {exc}; "
            "check --temporal-address / TOOLTRAIL_TEMPORAL_ADDRESS"
        ) from exc


ClientFactory = Callable[[Settings], Awaitable[Client]]
"""Makes a deployment's Temporal client from the settings (``open_deployment(client=...)``)."""


@dataclass(frozen=True)
class Deployment:
    """What a client or a worker of one deployment runs on (see ``open_deployment``)."""

    settings: Settings
    """The settings every default came from."""
    host: Host
    """The host wiring."""
    client: Client
    """The Temporal client, with the settings' converter, TLS or API key, and tracing."""
    store: AuditStore
    """The audit database, at the migrations' head."""
    task_queue: str
    """The task queue of the deployment's turns."""


@contextlib.asynccontextmanager
async def open_deployment(
    host: Host | ToolRegistry | list[Tool] | None,
    *,
    temporal_address: str | None = None,
    namespace: str | None = None,
    task_queue: str | None = None,
    database_url: str | None = None,
    migrate: bool = False,
    client: ClientFactory | None = None,
    engine_options: dict[str, Any] | None = None,
) -> AsyncIterator[Deployment]:
    """Open what ``connect``, ``local`` and ``worker`` run on; close the store on exit.

    In this order: the settings (``TOOLTRAIL_*`` environment variables, ``.env``); the
    database URL (``database_url``, else the host's, else the settings'); the schema (checked
    to be at the migrations' head, or migrated with ``migrate=True``), so a bad database
    fails before anything connects; the Temporal client; the audit store.

    Args:
        host: the host wiring (or a registry, or a list of tools); ``None``: no tools (a
            client that only starts turns).
        temporal_address: the Temporal frontend (default: the settings').
        namespace: the Temporal namespace (default: the settings').
        task_queue: the task queue (default: the settings').
        database_url: the audit database (default: the host's, else the settings').
        migrate: upgrade the database to the migrations' head instead of checking it.
        client: makes the client instead of connecting to ``temporal_address`` (the
            embedded server's client, say); gets the settings.
        engine_options: for the database engine (``pool_size``, ...; default: the settings').

    Raises:
        DatabaseSchemaError: the database is not at the migrations' head (and not
            ``migrate``).
        ConfigurationError: Temporal cannot be reached.
    """
    settings = Settings()
    wired = Host() if host is None else Host.coerce(host)
    url = database_url or wired.database_url or settings.effective_database_url()
    store = await open_store(url, migrate=migrate, **(engine_options or {}))
    try:
        if client is None:
            temporal = await connect_client(
                temporal_address or settings.temporal_address,
                namespace=namespace or settings.namespace,
                **settings_client_options(settings),
            )
        else:
            temporal = await client(settings)
        yield Deployment(
            settings=settings,
            host=wired,
            client=temporal,
            store=store,
            task_queue=task_queue or settings.task_queue,
        )
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def worker(
    host: Host | ToolRegistry | list[Tool],
    *,
    temporal_address: str | None = None,
    namespace: str | None = None,
    task_queue: str | None = None,
    database_url: str | None = None,
    graceful_shutdown: timedelta = timedelta(seconds=20),
    engine_options: dict[str, Any] | None = None,
    **worker_options: Any,
) -> AsyncIterator[Worker]:
    """Run a tooltrail worker against an existing Temporal cluster while the block runs.

    Options default to the settings (``TOOLTRAIL_*`` environment variables). The database must
    be migrated (``tooltrail db upgrade``). On exit, running tool attempts get
    ``graceful_shutdown`` to finish before they are cancelled (and retried elsewhere).
    ``engine_options`` go to the database engine (``pool_size``, ``max_overflow``, ...), the
    other keyword arguments to ``build_worker`` (slots, workflow cache, ``deployment_config``);
    they default to the settings (worker versioning: ``worker_deployment`` and
    ``worker_build_id``, see ``tooltrail.runtime.versioning``).

    Raises:
        DatabaseSchemaError: the database is not at the migrations' head.
    """
    async with open_deployment(
        host,
        temporal_address=temporal_address,
        namespace=namespace,
        task_queue=task_queue,
        database_url=database_url,
        engine_options=engine_options,
    ) as deployment:
        if "deployment_config" not in worker_options:
            # Worker versioning from the settings (docs/operations/upgrading.md); None: unversioned.
            worker_options["deployment_config"] = deployment_config(
                deployment.settings.worker_deployment, deployment.settings.worker_build_id
            )
        running = build_worker(
            deployment.client,
            deployment.host,
            task_queue=deployment.task_queue,
            store=deployment.store,
            graceful_shutdown_timeout=graceful_shutdown,
            **worker_options,
        )
        # The worker's background reconciliation (off with TOOLTRAIL_RECONCILE_ENABLED=0).
        names = deployment.host.registry.names()
        async with (
            running,
            background_reconciliation(
                deployment.client,
                deployment.store,
                deployment.settings,
                task_queue=deployment.task_queue,
                redactors=host_redactors(deployment.host),
            ),
            # A loud warning while workers with other tools poll the same queue.
            watch_registry_peers(
                deployment.client, deployment.task_queue, registry_fingerprint(names), names
            ),
        ):
            yield running
