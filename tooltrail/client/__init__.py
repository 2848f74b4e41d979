"""The client API: start turns, wait for their results, read the audit trail and memory.

``local(host)`` brings up everything in-process (the embedded Temporal dev server, a worker,
the SQLite audit database); ``connect(...)`` talks to an existing deployment, whose workers
run ``tooltrail worker``. The client runs no tool code: the workers decide everything about
the tools (``tooltrail.turn.prepare``), so ``connect()`` needs no host.

``_tooltrail`` holds ``Tooltrail``; ``_handles`` the turn and agent handles; ``_stacks``
``local`` and ``connect``.

May import: every layer below it (ground, ``core``, ``tools``, ``llm``, ``db``, ``pipeline``,
``runtime``, ``ops``); only the command line imports it.
"""

from tooltrail.client._handles import DEFAULT_APPROVAL_VALIDITY as DEFAULT_APPROVAL_VALIDITY
from tooltrail.client._handles import AgentHandle, TurnHandle, TurnResult, WaitingApproval
from tooltrail.client._handles import turn_error as turn_error
from tooltrail.client._handles import wait_for_result as wait_for_result
from tooltrail.client._stacks import connect, local
from tooltrail.client._tooltrail import MAX_START_BYTES as MAX_START_BYTES
from tooltrail.client._tooltrail import StuckTurn, Tooltrail

__all__ = [
    "AgentHandle",
    "StuckTurn",
    "Tooltrail",
    "TurnHandle",
    "TurnResult",
    "WaitingApproval",
    "connect",
    "local",
]
