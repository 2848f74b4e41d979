"""The start of a turn: what the worker decides before any call runs.

A standalone turn asks the worker for its plan in a local activity (``TURN_PREPARE``); an
agent turn asks the model, whose activity answers with the model's response and the plan
of its calls together. Either way the turn then takes up the plan and the session's state
in it (``TurnState.adopt``). Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from tooltrail.core.messages import MODEL_RETRY_POLICY
from tooltrail.core.wire import (
    MODEL_TURN,
    TURN_PREPARE,
    ModelPhase,
    ModelTurnOutcome,
    ModelTurnRequest,
    PrepareTurn,
    TurnPlan,
)
from tooltrail.errors import TurnFailed
from tooltrail.workflows.failures import failure_text, raise_if_cancelled_activity
from tooltrail.workflows.state import TurnState
from tooltrail.workflows.trail import Trail

__all__ = ["Planning"]

# The plan needs the session's state from the database: wait for it as long as for the
# final audit write (until it answers), so a database outage delays a turn's start rather
# than failing it.
_PREPARE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
)
# The longest one model call may take, as an activity or a local one.
_MODEL_TIMEOUT = timedelta(minutes=10)


class Planning:
    """Gets the turn's plan from the worker (and an agent turn's calls from the model)."""

    def __init__(self, state: TurnState, trail: Trail) -> None:
        """Share the turn's state and its trail."""
        self._state = state
        self._trail = trail

    async def prepare(self) -> TurnPlan:
        """Ask the worker for the turn's plan (a local activity: only the plan is history)."""
        inp = self._state.input
        try:
            plan: TurnPlan = await workflow.execute_local_activity(
                TURN_PREPARE,
                PrepareTurn(
                    session_id=inp.session_id,
                    calls=inp.calls,
                    advertised=inp.advertised,
                    parallel=inp.config.dispatch == "parallel",
                    shadow=inp.shadow is not None,
                    interactive=inp.config.interactive,
                ),
                result_type=TurnPlan,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=_PREPARE_RETRY,
            )
        except (ActivityError, ApplicationError) as failure:
            raise_if_cancelled_activity()
            raise TurnFailed(f"the turn could not be prepared: {failure_text(failure)}") from None
        return plan

    async def ask_model(self, phase: ModelPhase) -> ModelTurnOutcome:
        """Ask the model (one activity, local with ``phase.local``; it keeps the conversation).

        The answer comes with the worker's plan of its calls and the session's state, which
        the turn takes up.
        """
        state = self._state
        await self._trail.checkpoint()  # a batch of the trail first, when one is due
        request = ModelTurnRequest(
            phase=phase,
            turn_id=state.record.turn_id,
            verdicts=state.input.config.dispatch == "parallel",
            advertised=state.input.advertised,
            session_id=state.input.session_id,
            interactive=state.input.config.interactive,
        )
        try:
            if phase.local:
                # start_agent(local_model=True): the call runs in this workflow task, so the
                # turn saves the activity's server round trip and the workflow task after it.
                outcome: ModelTurnOutcome = await workflow.execute_local_activity(
                    MODEL_TURN,
                    request,
                    result_type=ModelTurnOutcome,
                    start_to_close_timeout=_MODEL_TIMEOUT,
                    retry_policy=MODEL_RETRY_POLICY,
                )
            else:
                outcome = await workflow.execute_activity(
                    MODEL_TURN,
                    request,
                    result_type=ModelTurnOutcome,
                    start_to_close_timeout=_MODEL_TIMEOUT,
                    heartbeat_timeout=timedelta(seconds=60),
                    retry_policy=MODEL_RETRY_POLICY,
                )
        except (ActivityError, ApplicationError) as failure:
            raise_if_cancelled_activity()
            raise TurnFailed(f"model call failed: {failure_text(failure)}") from None
        state.adopt(outcome.plan)
        return outcome
