"""Forking an agent run: a new run that starts again from one of the original's turns.

After LangGraph's time travel and DBOS's fork, with what neither keeps: an audit trail of
the fork. The new run's conversation is a copy of the original's up to turn ``K`` (what
turn ``K``'s model call read), so its first model call is turn ``K`` asked again; the
copy is written to SQL before the run starts, so the transcript stays out of workflow
history as it does for any run. A ``run_fork`` row links both runs ("forked to X at turn K"
in the original's trail, "forked from Y at turn K" in the new one's).

Turns are numbered from 0 as in turn ids (``RUN-turn-K``), and a fork's turns go on with
the original's numbers (its first turn is ``NEW-turn-K``): the ``K``-th model answer of a
fork's conversation is then its turn ``K`` too, so a fork of a fork counts the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from tooltrail.core.config import RunConfig
from tooltrail.core.wire import AgentCarry, AgentRunInput, AgentRunOutput, ModelSettings
from tooltrail.db.runs import (
    ConversationRow,
    copy_conversation,
    forget_fork,
    load_run_rows,
    record_fork,
)
from tooltrail.errors import ConfigurationError

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle

    from tooltrail.db.store import AuditStore

__all__ = ["fork_prefix", "original_input", "start_fork"]


def fork_prefix(
    rows: Sequence[ConversationRow], *, run_id: str, from_turn: int, message: str | None
) -> list[ConversationRow]:
    """The conversation a fork from ``from_turn`` starts with.

    Everything before turn ``from_turn``'s answer (the model's ``from_turn``-th answer), with
    the last user message's text replaced by ``message`` when given.

    Raises:
        ConfigurationError: no such run, a turn it does not have, or no user message to
            replace.
    """
    if from_turn < 0:
        raise ConfigurationError(
            f"--from-turn must be 0 or more (turns count from 0), not {from_turn}"
        )
    if not rows:
        raise ConfigurationError(
            f"no agent run {run_id!r} in the audit database (it has no conversation); "
            "check the run id and --database-url"
        )
    answers = [index for index, row in enumerate(rows) if row.usage is not None]
    if from_turn >= len(answers):
        have = f"turns 0 to {len(answers) - 1}" if answers else "no answered turn yet"
        raise ConfigurationError(f"run {run_id!r} has {have}: cannot fork from turn {from_turn}")
    prefix = list(rows[: answers[from_turn]])
    if message is not None:
        users = [index for index, row in enumerate(prefix) if row.message.role == "user"]
        if not users:
            raise ConfigurationError(
                f"run {run_id!r} has no user message before turn {from_turn} to replace"
            )
        last = prefix[users[-1]]
        prefix[users[-1]] = last.model_copy(
            update={"message": last.message.model_copy(update={"content": message})}
        )
    return prefix


async def original_input(client: Client, run_id: str) -> AgentRunInput | None:
    """The input the run's latest segment started with, or ``None`` when it cannot be read.

    Read from the first event of its history (the segment's input carries the model
    settings, configuration and tools of the run); gone after the namespace's retention.
    """
    handle = client.get_workflow_handle(run_id)
    try:
        async for event in handle.fetch_history_events():
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            if not payloads:
                return None
            decoded = await client.data_converter.decode(list(payloads), [AgentRunInput])
            value = decoded[0]
            return value if isinstance(value, AgentRunInput) else None
    except (RPCError, ValueError, TypeError):
        return None
    return None


async def start_fork(
    client: Client,
    store: AuditStore,
    *,
    task_queue: str,
    run_id: str,
    from_turn: int,
    message: str | None = None,
    new_run_id: str | None = None,
    session_id: str | None = None,
    model: ModelSettings | str | None = None,
    config: RunConfig | None = None,
    max_turns: int | None = None,
) -> WorkflowHandle[AgentRunInput, AgentRunOutput]:
    """Copy the conversation, link both runs, start the new run; see ``Tooltrail.fork_agent``.

    Raises:
        ConfigurationError: a bad ``from_turn``, or no such run.
    """
    async with store.sessions() as session:
        rows = await load_run_rows(session, run_id=run_id)
        taken = bool(new_run_id) and bool(await load_run_rows(session, run_id=str(new_run_id)))
    if taken:
        raise ConfigurationError(f"run {new_run_id!r} exists already; choose another id")
    prefix = fork_prefix(rows, run_id=run_id, from_turn=from_turn, message=message)
    original = await original_input(client, run_id)
    new_run_id = new_run_id or f"run-{uuid.uuid4()}"
    if isinstance(model, str):
        settings = ModelSettings(model=model)
    else:
        settings = model or (original.settings if original else ModelSettings())
    # Turn numbers go on from the original's, so the bound counts the copied turns too.
    limit = original.max_turns if original and max_turns is None else (max_turns or 10) + from_turn
    inp = AgentRunInput(
        # A session of its own: the fork's calls must not count in the original's loop window.
        session_id=session_id or new_run_id,
        settings=settings,
        advertised=original.advertised if original else None,
        config=config or (original.config if original else RunConfig()),
        max_turns=max(limit, from_turn + 1),
        turns_per_segment=original.turns_per_segment if original else 20,
        local_model=original.local_model if original else False,
        carry=AgentCarry(turn_index=from_turn, next_seq=len(prefix)),
    )
    async with store.sessions.begin() as session:
        await copy_conversation(session, run_id=new_run_id, rows=prefix)
        await record_fork(
            session,
            run_id=new_run_id,
            source_run_id=run_id,
            from_turn=from_turn,
            message_replaced=message is not None,
            created_at=datetime.now(UTC),
        )
    try:
        return await client.start_workflow(
            "AgentRunWorkflow",
            inp,
            id=new_run_id,
            task_queue=task_queue,
            result_type=AgentRunOutput,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except BaseException as exc:
        # No run started: neither trail may say it was forked, nor may a copy linger.
        async with store.sessions.begin() as session:
            await forget_fork(session, run_id=new_run_id)
        if isinstance(exc, WorkflowAlreadyStartedError):
            raise ConfigurationError(
                f"a workflow {new_run_id!r} exists already; choose another run id"
            ) from exc
        raise
