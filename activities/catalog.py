"""The catalog activity: the tools this worker serves (see ``workflows.catalog``)."""

from __future__ import annotations

from temporalio import activity

from tooltrail.host import Host
from tooltrail.wire import TOOL_CATALOG, WorkerCatalog

__all__ = ["CatalogActivities"]


class CatalogActivities:
    """Answers with the worker's registry; one instance per worker."""

    def __init__(self, host: Host) -> None:
        """Wire the host whose registry is served."""
        self.host = host

    @activity.defn(name=TOOL_CATALOG)
    async def catalog(self) -> WorkerCatalog:
        """Return the names and declarations of the worker's tools."""
        return WorkerCatalog(names=self.host.registry.names(), tools=self.host.tool_meta())
