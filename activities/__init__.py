"""Activities: all of tooltrail's I/O (tool attempts, audit writes, session cleanup)."""

from tooltrail.activities.persistence import AuditActivities, SessionActivities
from tooltrail.activities.recovery import RecoveryActivities
from tooltrail.activities.tool_execution import ToolActivities

__all__ = ["AuditActivities", "RecoveryActivities", "SessionActivities", "ToolActivities"]
