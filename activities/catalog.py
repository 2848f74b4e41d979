"""The catalog activity: the tools the workers of the queue serve (see ``workflows.catalog``)."""

from __future__ import annotations

from temporalio import activity

from tooltrail.core.wire import TOOL_CATALOG, ToolMeta, WorkerCatalog
from tooltrail.pipeline.directory import RegistryDirectory
from tooltrail.pipeline.host import Host

__all__ = ["CatalogActivities"]


class CatalogActivities:
    """Answers with the worker's registry and its live peers'; one instance per worker."""

    def __init__(self, host: Host, directory: RegistryDirectory | None = None) -> None:
        """Wire the host whose registry is served, and the queue's directory of registries.

        With ``directory``, the tools of the queue's live peers with other tools are listed
        too (their calls are sent to them), as a turn that names no tools advertises them.
        """
        self.host = host
        self.directory = directory

    @activity.defn(name=TOOL_CATALOG)
    async def catalog(self) -> WorkerCatalog:
        """Return the names and declarations of the tools the queue's workers serve.

        This worker's own, plus those of live peers with other tools (its own settings win a
        name clash). If the directory cannot be read in time, this worker's own only.
        """
        names = self.host.registry.names()
        tools = dict(self.host.tool_meta())
        if self.directory is None:
            return WorkerCatalog(names=names, tools=tools)
        peers = await self.directory.peer_tools()  # bounded; empty if unknown in time
        if not peers:
            return WorkerCatalog(names=names, tools=tools)
        for name, settings in peers.items():
            tools.setdefault(name, ToolMeta.model_validate(settings))
        return WorkerCatalog(names=sorted({*names, *peers}), tools=tools)
