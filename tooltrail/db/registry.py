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

from tooltrail.db.orm import ToolRegistryRow
from tooltrail.db.store import AuditStore

__all__ = ["PublishedRegistry", "publish_registry", "queue_registries", "read_registries"]

_TABLE: Table = ToolRegistryRow.__table__  # type: ignore[assignment]


class PublishedRegistry(NamedTuple):
    """One registry as its workers published it."""

    tools: dict[str, Any]
    """The tool names, each with its settings (``ToolMeta``, as JSON)."""
    catalog: list[dict[str, Any]]
    """The tools' catalog entries (OpenAI's ``tools`` format), in the worker's order."""


async def publish_registry(
    store: AuditStore,
    *,
    task_queue: str,
    fingerprint: str,
    tools: dict[str, Any],
    now: datetime,
    catalog: list[dict[str, Any]] | None = None,
) -> None:
    """Insert or refresh one registry's row (its tools, catalog and ``last_seen``)."""
    # Compact and in the entries' own key order: what a peer reads back is what this worker
    # would offer a model, byte for byte once serialized again.
    text = json.dumps(catalog or [], separators=(",", ":"), ensure_ascii=False)
    async with store.engine.begin() as conn:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(_TABLE).values(
            task_queue=task_queue,
            fingerprint=fingerprint,
            tools=tools,
            catalog=text,
            last_seen=now,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[_TABLE.c.task_queue, _TABLE.c.fingerprint],
            set_={
                "tools": stmt.excluded.tools,
                "catalog": stmt.excluded.catalog,
                "last_seen": stmt.excluded.last_seen,
            },
        )
        await conn.execute(stmt)


async def read_registries(
    store: AuditStore, *, task_queue: str, seen_since: datetime
) -> dict[str, PublishedRegistry]:
    """The registries of ``task_queue`` seen since ``seen_since``, by fingerprint."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            select(_TABLE.c.fingerprint, _TABLE.c.tools, _TABLE.c.catalog).where(
                _TABLE.c.task_queue == task_queue, _TABLE.c.last_seen >= seen_since
            )
        )
        return {
            row.fingerprint: PublishedRegistry(dict(row.tools), _catalog(row.catalog))
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
