"""Activities: all of tooltrail's I/O (tool attempts, audit writes, session cleanup)."""

from activities.persistence import AuditActivities, SessionActivities
from activities.recovery import RecoveryActivities
from activities.tool_execution import ToolActivities

__all__ = ["AuditActivities", "RecoveryActivities", "SessionActivities", "ToolActivities"]
