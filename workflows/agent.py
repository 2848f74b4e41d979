"""``AgentRunWorkflow``: the durable agent loop, model turn after model turn.

Each turn is a child ``TurnWorkflow`` that starts with a model call; its tool results are
what the model reads next. The conversation itself lives in SQL (the model-turn activity
appends to it), so this history carries only each turn's new messages, and the run continues
as new every few turns to keep the history small however long the run.
"""

from __future__ import annotations

from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ParentClosePolicy

from tooltrail.core.messages import Message, Usage
from tooltrail.core.wire import (
    SESSION_CLEANUP,
    AgentCarry,
    AgentProgress,
    AgentRunInput,
    AgentRunOutput,
    CloseSessionInput,
    ModelPhase,
    TurnInput,
    TurnOutput,
)
from tooltrail.workflows.session import CLEANUP_RETRY, CLEANUP_TIMEOUT

__all__ = ["AgentRunWorkflow"]


def _add(total: Usage, more: Usage | None) -> Usage:
    return total if more is None else total + more


@workflow.defn(name="AgentRunWorkflow")
class AgentRunWorkflow:
    """Runs turns until the model answers without tool calls, or ``max_turns``."""

    @workflow.init
    def __init__(self, inp: AgentRunInput) -> None:
        """Pick up where the previous segment (before continue-as-new) stopped."""
        self._run_id = workflow.info().workflow_id
        self._carry = inp.carry.model_copy(deep=True) if inp.carry else AgentCarry()
        if inp.carry is None:
            self._carry.new_messages = list(inp.messages)
        self._status: Literal["model", "tools", "done"] = "model"
        self._stop_reason: str | None = None

    @workflow.query(name="progress")
    def progress(self) -> AgentProgress:
        """How far the run is."""
        return AgentProgress(
            run_id=self._run_id,
            turn_index=self._carry.turn_index,
            turns=list(self._carry.turns),
            usage=self._carry.usage,
            status=self._status,
        )

    @workflow.run
    async def run(self, inp: AgentRunInput) -> AgentRunOutput:
        """Alternate model calls and tool phases until the model is done."""
        carry = self._carry
        segment_turns = 0
        # Each turn reads the session's state with the conversation and appends its own tool
        # results: the run's history carries neither, so a model turn's cost does not grow
        # with the run or with earlier turns' outputs.
        while carry.turn_index < inp.max_turns:
            if segment_turns >= inp.turns_per_segment or (
                segment_turns > 0 and workflow.info().is_continue_as_new_suggested()
            ):
                # Keep the history small: the conversation is in SQL, the state is tiny.
                workflow.continue_as_new(inp.model_copy(update={"carry": carry, "messages": []}))
            turn_id = f"{self._run_id}-turn-{carry.turn_index}"
            self._status = "model"
            output: TurnOutput = await workflow.execute_child_workflow(
                "TurnWorkflow",
                TurnInput(
                    session_id=inp.session_id,
                    calls=[],
                    advertised=inp.advertised,
                    config=inp.config,
                    # The run's last allowed turn ends the run (spec §10.4's boundary).
                    ends_run=carry.turn_index + 1 >= inp.max_turns,
                    model=ModelPhase(
                        run_id=self._run_id,
                        start_seq=carry.next_seq,
                        new_messages=carry.new_messages,
                        settings=inp.settings,
                        local=inp.local_model,
                    ),
                ),
                id=turn_id,
                result_type=TurnOutput,
                # A turn is part of the run: cancelling the run cancels the turn in flight.
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            )
            carry.turns.append(turn_id)
            carry.turn_index += 1
            segment_turns += 1
            carry.usage = _add(carry.usage, output.usage)
            carry.next_seq += len(carry.new_messages) + 1
            assistant = output.assistant or Message.assistant("")
            self._stop_reason = output.stop_reason
            if not assistant.tool_calls:
                await self._close_session(inp.session_id)
                # A refusal is the answer: its text, and the stop reason says what it is.
                return self._done(assistant.content or assistant.refusal or "", "answer")
            # The turn stored its tool results after the answer; the next turn reads them.
            carry.next_seq += len(assistant.tool_calls)
            carry.new_messages = []
            self._status = "tools"
        await self._close_session(inp.session_id)
        return self._done("", "max_turns")

    def _done(self, text: str, stopped_by: Literal["answer", "max_turns"]) -> AgentRunOutput:
        self._status = "done"
        return AgentRunOutput(
            run_id=self._run_id,
            text=text,
            turns=list(self._carry.turns),
            usage=self._carry.usage,
            stopped_by=stopped_by,
            stop_reason=self._stop_reason,
        )

    async def _close_session(self, session_id: str) -> None:
        # The run is over: its scratch directory goes (best-effort, never fails the run). A
        # local activity: no server round trip at the end of every run. It runs on the worker
        # of this workflow task, which is as good a guess as any worker of the queue (scratch
        # directories live on whichever workers ran the tools).
        try:
            await workflow.execute_local_activity(
                SESSION_CLEANUP,
                CloseSessionInput(session_id=session_id),
                result_type=bool,
                start_to_close_timeout=CLEANUP_TIMEOUT,
                retry_policy=CLEANUP_RETRY,
            )
        except (ActivityError, ApplicationError) as failure:
            workflow.logger.warning("scratch cleanup of %r failed: %s", session_id, failure)
