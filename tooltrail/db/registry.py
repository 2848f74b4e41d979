"""The ``tool_registry`` directory: which tool sets the workers of each task queue serve.

One row per (task queue, registry fingerprint), upserted by every worker at start and then
periodically (``tooltrail.registry_check.RegistryDirectory``). Rows of stopped workers stay;
readers go by ``last_seen``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite

from tooltrail.db.orm import ToolRegistryRow
from tooltrail.db.store import AuditStore

__all__ = ["publish_registry", "queue_registries"]

_TABLE: Table = ToolRegistryRow.__table__  # type: ignore[assignment]


async def publish_registry(
    store: AuditStore,
    *,
    task_queue: str,
    fingerprint: str,
    tools: dict[str, Any],
    now: datetime,
) -> None:
    """Insert or refresh one registry's row (its tools and ``last_seen``)."""
    async with store.engine.begin() as conn:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(_TABLE).values(
            task_queue=task_queue, fingerprint=fingerprint, tools=tools, last_seen=now
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[_TABLE.c.task_queue, _TABLE.c.fingerprint],
            set_={"tools": stmt.excluded.tools, "last_seen": stmt.excluded.last_seen},
        )
        await conn.execute(stmt)


async def queue_registries(
    store: AuditStore, *, task_queue: str, seen_since: datetime
) -> dict[str, dict[str, Any]]:
    """The registries of ``task_queue`` seen since ``seen_since``: tools by fingerprint."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            select(_TABLE.c.fingerprint, _TABLE.c.tools).where(
                _TABLE.c.task_queue == task_queue, _TABLE.c.last_seen >= seen_since
            )
        )
        return {row.fingerprint: dict(row.tools) for row in rows}
