"""The turn's plan: what only the worker can decide, because the tools live there.

The parallel-safety verdicts and the memoize paths run the tools' own declarations on the
calls' arguments; the tools' settings, the host's features and the advertised names come
from the worker's host wiring; the session's state comes from the database. A client that
only starts turns therefore needs no tool code (and cannot disagree with the workers about
it). A standalone turn asks for its plan first, in a local activity (no server round trip;
only the plan enters the history); an agent turn gets it with the model's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from tooltrail.activities.local_only import refuse_unless_local
from tooltrail.core.results import ToolCall
from tooltrail.core.wire import (
    TURN_PREPARE,
    HostFeatures,
    PrepareTurn,
    SessionState,
    ToolMeta,
    TurnPlan,
)
from tooltrail.db.reachability import unreachable
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.directory import RegistryDirectory
from tooltrail.pipeline.host import Host

__all__ = ["SESSION_READ_DEADLINE_S", "TurnPlanner"]

log = logging.getLogger("tooltrail.turn")

SESSION_READ_DEADLINE_S = 5.0
"""How long a turn's start waits for its session's state before it starts without it."""


class TurnPlanner:
    """Plans turns from the worker's host wiring; one instance per worker."""

    def __init__(
        self, host: Host, store: AuditStore, directory: RegistryDirectory | None = None
    ) -> None:
        """Wire the host (its tools, hooks, middleware) and the database (session state).

        With ``directory``, a standalone turn that advertises "the worker's tools" advertises
        the tools of the queue's live peers too (their calls are sent to them).
        """
        self.host = host
        self.store = store
        self.directory = directory
        # The registry is frozen once the worker exists: its settings are worked out once.
        self._tools = {name: meta for name, meta in host.tool_meta().items() if meta != ToolMeta()}
        self._features = HostFeatures(
            hooks=bool(host.hooks), memory=host.memory, approvers=host.approver_keys()
        )

    def plan(
        self,
        calls: Sequence[ToolCall],
        *,
        advertised: list[str] | None,
        parallel: bool,
        memo: bool = True,
        peer_tools: dict[str, dict[str, Any]] | None = None,
    ) -> TurnPlan:
        """Decide a turn's calls (the session's state is left at its default).

        Args:
            calls: the turn's calls, in the model's order.
            advertised: the names the turn advertises; ``None``: the worker's tools.
            parallel: judge the calls for parallel waves.
            memo: include the host's memoize plan and the calls' paths.
            peer_tools: tools of live peers this worker lacks, with their settings; advertised
                too when ``advertised`` is ``None``. The settings of those the turn
                advertises join the plan's (an agent turn's model may call a peer's tool).
        """
        tools = dict(self._tools)
        names = self.host.registry.names()
        if advertised is None and peer_tools:
            names = sorted({*names, *peer_tools})
        wanted = None if advertised is None else set(advertised)
        for name, settings in (peer_tools or {}).items():
            if wanted is not None and name not in wanted:
                continue
            # A peer's tool never runs as a local activity here: this worker lacks it.
            meta = ToolMeta.model_validate({**settings, "local": False})
            if meta != ToolMeta():
                tools[name] = meta
        plan = TurnPlan(
            advertised=names if advertised is None else None,
            tools=tools,
            features=self._features,
            verdicts=self.host.verdicts(calls) if parallel else None,
        )
        memoizer = self.host.memoizer() if memo else None
        if memoizer is not None:
            paths = {}
            for call in calls:
                if isinstance(call.arguments, dict):
                    found = memoizer.paths(call.name, call.arguments)
                    if found:
                        paths[call.id] = found
            first = next(iter(self.host.middleware), None)
            plan.memo = memoizer.plan(outermost=first is memoizer)
            plan.memo_paths = paths
        return plan

    @activity.defn(name=TURN_PREPARE)
    async def prepare(self, inp: PrepareTurn) -> TurnPlan:
        """Plan a standalone turn, with its session's state as the previous turn saved it.

        Raises:
            ApplicationError: scheduled as a regular activity (not by a tooltrail turn).
        """
        refuse_unless_local(TURN_PREPARE)
        if inp.interactive:
            await self.agree_on_approvers()
        peers = None
        if inp.advertised is None and self.directory is not None:
            peers = await self.directory.peer_tools()
        plan = self.plan(
            inp.calls, advertised=inp.advertised, parallel=inp.parallel, peer_tools=peers
        )
        if not inp.shadow:  # a shadow starts from the original turn's state, saves nothing
            plan.session = await self._session_state(inp.session_id)
        return plan

    async def agree_on_approvers(self) -> None:
        """Refuse an interactive turn while the workers of the queue disagree on approvers.

        A worker without approvers among workers with them would take an unsigned answer
        for a turn the others hold to signatures (and the other way round): it says so and
        plans no interactive turn until they agree.

        Raises:
            ApplicationError: (non-retryable) a live peer has another approver set.
        """
        if self.directory is None:
            return
        others = await self.directory.approver_conflicts()
        if not others:
            return
        mine = self.directory.approvers or "none"
        text = (
            f"the workers of task queue {self.directory.task_queue!r} disagree on their "
            f"approvers: this worker has {mine}, {', '.join(others)} another; interactive turns "
            "are refused until every worker has the same TOOLTRAIL_APPROVERS"
        )
        log.warning("%s", text)
        raise ApplicationError(text, type="ApproversDisagree", non_retryable=True)

    async def _session_state(self, session_id: str) -> SessionState:
        """The session's state; a fresh one if the database cannot be reached in time.

        A turn starts and runs while the database is down (its records wait, as mid-turn
        batches do). It then starts from a fresh state (an empty loop window and memo cache)
        at version 0, so the state it saves (version 1) never replaces a stored one: session
        states are only written over by newer versions.
        """
        try:
            return await asyncio.wait_for(
                self.store.session_state(session_id), SESSION_READ_DEADLINE_S
            )
        except Exception as exc:
            if not unreachable(exc):
                raise
            log.warning(
                "session %r: the database cannot be reached; the turn starts without the "
                "session's state (an empty loop window and memo cache), and keeps the stored one",
                session_id,
                exc_info=True,
            )
            return SessionState()
