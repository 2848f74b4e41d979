"""Determinism: the current workflow code must replay every recorded history unchanged."""

from __future__ import annotations

import pytest

from tests.support.history_scenarios import HISTORIES, SCENARIOS
from tooltrail.ops.histories import load_histories, replay_histories

HISTORY_FILES = load_histories([HISTORIES])


def test_the_corpus_has_every_scenario() -> None:
    assert {source.rsplit("/", 1)[-1].removesuffix(".json") for source, _ in HISTORY_FILES} == set(
        SCENARIOS
    )


@pytest.mark.parametrize(
    "entry",
    HISTORY_FILES,
    ids=[s.rsplit("/", 1)[-1].removesuffix(".json") for s, _ in HISTORY_FILES],
)
async def test_history_replays(entry: tuple[str, object]) -> None:
    report = await replay_histories([entry])  # type: ignore[list-item]
    assert report.ok, report.failures


async def test_the_corpus_replays_as_a_production_worker_runs_it() -> None:
    # Production workers pass tooltrail's workflow modules through the sandbox.
    report = await replay_histories(HISTORY_FILES, strict=False)
    assert report.ok, report.failures
