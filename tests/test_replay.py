"""Determinism: the current workflow code must replay every recorded history unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.history_scenarios import HISTORIES, SCENARIOS
from tooltrail.worker import sandbox_runner
from workflows import CloseSessionWorkflow, TurnWorkflow

FILES = sorted(HISTORIES.glob("*.json"))


def test_the_corpus_has_every_scenario() -> None:
    assert {path.stem for path in FILES} == set(SCENARIOS)


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
async def test_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())  # noqa: ASYNC240 - tiny file
    replayer = Replayer(
        workflows=[TurnWorkflow, CloseSessionWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=sandbox_runner(),
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
