"""Activities: all of tooltrail's I/O (tool attempts, audit writes, session cleanup).

Each activity is a method of a class that receives its dependencies in ``__init__``, with an
explicit, stable name. May import: every layer below the worker process (ground, ``core``,
``tools``, ``llm``, ``db``, ``pipeline``), never ``tooltrail.workflows``.
"""

from tooltrail.activities.persistence import AuditActivities, SessionActivities
from tooltrail.activities.recovery import RecoveryActivities
from tooltrail.activities.tool_execution import ToolActivities

__all__ = ["AuditActivities", "RecoveryActivities", "SessionActivities", "ToolActivities"]
