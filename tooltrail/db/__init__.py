"""The audit database: schema, engine, idempotent writes, queries and migrations."""

from tooltrail.db.engine import create_engine, normalize_url
from tooltrail.db.migrate import check_schema, upgrade
from tooltrail.db.store import AuditStore, TurnSummary

__all__ = ["AuditStore", "TurnSummary", "check_schema", "create_engine", "normalize_url", "upgrade"]
