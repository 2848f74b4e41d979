"""Workflow histories: export them, and replay them against the current workflow code.

A replay that fails means the current code would break turns recorded with the old code
(nondeterminism): the deploy must not happen, or the change needs ``workflow.patched``.

Exports are the history as the server holds it: with the codec on, its payloads (and failure
messages) stay encrypted in the file, so an export is no more readable than the history
itself. Replaying one needs the same keys (``TOOLTRAIL_CODEC_KEYS``), as any worker does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer

from tooltrail.runtime.worker import sandbox_runner, settings_data_converter
from tooltrail.settings import Settings
from tooltrail.workflows.agent import AgentRunWorkflow
from tooltrail.workflows.authorize import AuthorizeToolWorkflow
from tooltrail.workflows.catalog import ToolCatalogWorkflow
from tooltrail.workflows.session import CloseSessionWorkflow
from tooltrail.workflows.turn import TurnWorkflow

__all__ = [
    "ReplayOutcome",
    "ReplayReport",
    "export_history",
    "export_recent",
    "fetch_histories",
    "history_file_name",
    "load_histories",
    "replay_histories",
]

TURN_QUERY = 'WorkflowType="TurnWorkflow"'

_FILE_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
_FILE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class ReplayOutcome(BaseModel):
    """How one history replayed."""

    workflow_id: str
    source: str
    ok: bool
    error: str | None = None


class ReplayReport(BaseModel):
    """The replay of a set of histories."""

    outcomes: list[ReplayOutcome]

    @property
    def ok(self) -> bool:
        """True when every history replayed."""
        return all(outcome.ok for outcome in self.outcomes)

    @property
    def failures(self) -> list[ReplayOutcome]:
        """The histories that did not replay."""
        return [outcome for outcome in self.outcomes if not outcome.ok]


async def export_history(client: Client, turn_id: str) -> str:
    """Return a turn's history in Temporal's JSON history format (plus its ``workflowId``)."""
    history = await client.get_workflow_handle(turn_id).fetch_history()
    return json.dumps({"workflowId": turn_id, **json.loads(history.to_json())})


def history_file_name(workflow_id: str) -> str:
    """Return the file name of a workflow's exported history: ``<id>.json`` when that is safe.

    A workflow id is caller data (``../x``, ``/etc/passwd``, 1,000 characters): an id that is
    not a plain file name is encoded, as its safe characters plus a digest of the exact id,
    so the file stays inside the export directory; the ``+`` before the digest, never part
    of a plain name, keeps two ids from sharing a file. The id itself is kept inside the file
    (``workflowId``).
    """
    if _FILE_SAFE.fullmatch(workflow_id):
        return f"{workflow_id}.json"
    readable = _FILE_UNSAFE.sub("_", workflow_id).lstrip(".")[:64]
    digest = hashlib.blake2b(workflow_id.encode("utf-8", "surrogatepass"), digest_size=10)
    return f"{readable}+{digest.hexdigest()}.json"


async def export_recent(
    client: Client, directory: Path, *, limit: int = 20, query: str = TURN_QUERY
) -> list[Path]:
    """Write the newest matching histories into ``directory`` (see ``history_file_name``)."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    written = []
    async for execution in client.list_workflows(query, limit=limit):
        path = directory / history_file_name(execution.id)
        text = await export_history(client, execution.id)
        await asyncio.to_thread(path.write_text, text + "\n")
        written.append(path)
    return written


def load_histories(paths: Iterable[Path]) -> list[tuple[str, WorkflowHistory]]:
    """Read histories from files and directories (``*.json`` inside them)."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.json")) if path.is_dir() else [path])
    histories = []
    for file in files:
        data: Any = json.loads(file.read_text())
        # Temporal's JSON format has no workflow id; tooltrail's exports keep it alongside
        # the events ("workflowId"), otherwise the file name stands in for it.
        workflow_id = data.pop("workflowId", None) if isinstance(data, dict) else None
        histories.append((str(file), WorkflowHistory.from_json(workflow_id or file.stem, data)))
    return histories


async def fetch_histories(
    client: Client, *, query: str = TURN_QUERY, limit: int = 100
) -> list[tuple[str, WorkflowHistory]]:
    """Fetch the histories of the workflows a visibility query matches."""
    histories = []
    async for execution in client.list_workflows(query, limit=limit):
        history = await client.get_workflow_handle(execution.id).fetch_history()
        histories.append((f"server:{execution.id}", history))
    return histories


async def replay_histories(
    histories: Sequence[tuple[str, WorkflowHistory]],
    *,
    workflows: Sequence[type] | None = None,
    strict: bool = True,
    data_converter: DataConverter | None = None,
) -> ReplayReport:
    """Replay histories against the workflow code (default: tooltrail's workflows).

    With ``strict`` (the default) the workflow modules run under the sandbox's full watch;
    without it, as a production worker runs them (see ``tooltrail.runtime.worker.sandbox_runner``).

    Args:
        histories: ``(source, history)`` pairs (``load_histories``, ``fetch_histories``).
        workflows: the workflow classes (default: tooltrail's).
        strict: run the workflow modules under the sandbox's full watch.
        data_converter: the converter that decodes the payloads (default: the settings', so
            with ``TOOLTRAIL_CODEC_KEYS`` encrypted histories replay; plain ones too).
    """
    if workflows is None:
        workflows = [
            TurnWorkflow,
            CloseSessionWorkflow,
            AgentRunWorkflow,
            ToolCatalogWorkflow,
            AuthorizeToolWorkflow,
        ]
    replayer = Replayer(
        workflows=list(workflows),
        data_converter=data_converter or settings_data_converter(Settings()),
        workflow_runner=sandbox_runner(strict=strict),
    )
    outcomes = []
    for source, history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        failure = result.replay_failure
        outcomes.append(
            ReplayOutcome(
                workflow_id=history.workflow_id,
                source=source,
                ok=failure is None,
                error=None if failure is None else f"{type(failure).__name__}: {failure}",
            )
        )
    return ReplayReport(outcomes=outcomes)
