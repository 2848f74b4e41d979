"""The ``tool_registry`` directory: which tool sets the workers of each task queue serve.

One row per (task queue, registry fingerprint), upserted by every worker at start and then
periodically (``tooltrail.pipeline.directory.RegistryDirectory``). Rows of stopped workers stay;
readers go by ``last_seen``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite

from tooltrail.db.orm import ToolRegistryRow, WorkerApproversRow
from tooltrail.db.store import AuditStore

__all__ = [
    "PublishedApprovers",
    "PublishedRegistry",
    "catalog_text",
    "publish_approvers",
    "publish_registry",
    "queue_registries",
    "read_approvers",
    "read_registries",
]

_TABLE: Table = ToolRegistryRow.__table__  # type: ignore[assignment]
_APPROVERS: Table = WorkerApproversRow.__table__  # type: ignore[assignment]


class PublishedRegistry(NamedTuple):
    """One registry as its workers published it."""

    tools: dict[str, Any]
    """The tool names, each with its settings (``ToolMeta``, as JSON)."""
    catalog: list[dict[str, Any]]
    """The tools' catalog entries (OpenAI's ``tools`` format), in the worker's order."""
    catalog_text: str = ""
    """The catalog as stored (what the row's MAC covers)."""
    mac: str = ""
    """The publishing worker's MAC over the row (``tooltrail.core.proofs.row_mac``)."""


class PublishedApprovers(NamedTuple):
    """One worker's approver set as it published it."""

    worker: str
    approvers: str
    """``approvers_fingerprint`` of the set; empty: unsigned approvals."""
    mac: str


async def publish_registry(
    store: AuditStore,
    *,
    task_queue: str,
    fingerprint: str,
    tools: dict[str, Any],
    now: datetime,
    catalog: list[dict[str, Any]] | None = None,
    mac: str = "",
) -> None:
    """Insert or refresh one registry's row (its tools, catalog, MAC and ``last_seen``)."""
    text = catalog_text(catalog)
    async with store.engine.begin() as conn:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(_TABLE).values(
            task_queue=task_queue,
            fingerprint=fingerprint,
            tools=tools,
            catalog=text,
            last_seen=now,
            mac=mac,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[_TABLE.c.task_queue, _TABLE.c.fingerprint],
            set_={
                "tools": stmt.excluded.tools,
                "catalog": stmt.excluded.catalog,
                "last_seen": stmt.excluded.last_seen,
                "mac": stmt.excluded.mac,
            },
        )
        await conn.execute(stmt)


def catalog_text(catalog: list[dict[str, Any]] | None) -> str:
    """The catalog as a row stores it.

    Compact and in the entries' own key order: what a peer reads back is what this worker
    would offer a model, byte for byte once serialized again.
    """
    return json.dumps(catalog or [], separators=(",", ":"), ensure_ascii=False)


async def publish_approvers(
    store: AuditStore,
    *,
    task_queue: str,
    worker: str,
    approvers: str,
    mac: str,
    now: datetime,
) -> None:
    """Insert or refresh one worker's approver set."""
    async with store.engine.begin() as conn:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(_APPROVERS).values(
            task_queue=task_queue, worker=worker, approvers=approvers, mac=mac, last_seen=now
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[_APPROVERS.c.task_queue, _APPROVERS.c.worker],
            set_={
                "approvers": stmt.excluded.approvers,
                "mac": stmt.excluded.mac,
                "last_seen": stmt.excluded.last_seen,
            },
        )
        await conn.execute(stmt)


async def read_approvers(
    store: AuditStore, *, task_queue: str, seen_since: datetime
) -> list[PublishedApprovers]:
    """The approver sets the workers of ``task_queue`` published since ``seen_since``."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            select(_APPROVERS.c.worker, _APPROVERS.c.approvers, _APPROVERS.c.mac).where(
                _APPROVERS.c.task_queue == task_queue, _APPROVERS.c.last_seen >= seen_since
            )
        )
        return [PublishedApprovers(row.worker, row.approvers, row.mac) for row in rows]


async def read_registries(
    store: AuditStore, *, task_queue: str, seen_since: datetime
) -> dict[str, PublishedRegistry]:
    """The registries of ``task_queue`` seen since ``seen_since``, by fingerprint."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            select(_TABLE.c.fingerprint, _TABLE.c.tools, _TABLE.c.catalog, _TABLE.c.mac).where(
                _TABLE.c.task_queue == task_queue, _TABLE.c.last_seen >= seen_since
            )
        )
        return {
            row.fingerprint: PublishedRegistry(
                dict(row.tools), _catalog(row.catalog), row.catalog, row.mac
            )
            for row in rows
        }


async def queue_registries(
    store: AuditStore, *, task_queue: str, seen_since: datetime
) -> dict[str, dict[str, Any]]:
    """The registries of ``task_queue`` seen since ``seen_since``: tools by fingerprint."""
    found = await read_registries(store, task_queue=task_queue, seen_since=seen_since)
    return {fingerprint: registry.tools for fingerprint, registry in found.items()}


def _catalog(text: str) -> list[dict[str, Any]]:
    """The catalog entries of a row; entries that are not a named function spec are left out."""
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    return [
        entry
        for entry in value
        if isinstance(entry, dict)
        and isinstance(entry.get("function"), dict)
        and isinstance(entry["function"].get("name"), str)
    ]
