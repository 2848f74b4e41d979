"""The database layer: schema, engine, migrations, and every SQL statement tooltrail runs.

The audit trail and memory (``store``), the shared circuit breakers (``health``) and the
idempotency claims (``idempotency``) each have their module here; the logic they serve
(``tooltrail.core.breaker``, ``tooltrail.tools.idempotency``) imports no SQL.

May import: ``tooltrail.errors``, ``tooltrail.core``, ``tooltrail.settings`` and the store
contracts of ``tooltrail.tools`` (idempotency); it is the only package that imports SQL.
"""

from tooltrail.db.engine import create_engine, normalize_url
from tooltrail.db.health import HealthStore
from tooltrail.db.idempotency import SqlIdempotencyStore
from tooltrail.db.migrate import check_schema, upgrade
from tooltrail.db.store import AuditStore, TurnSummary

__all__ = [
    "AuditStore",
    "HealthStore",
    "SqlIdempotencyStore",
    "TurnSummary",
    "check_schema",
    "create_engine",
    "normalize_url",
    "upgrade",
]
