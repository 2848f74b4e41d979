"""Session scratch directories: one per exact session id, private to the worker's user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tooltrail.tools.scratch import ScratchDirs


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("a/b", "a_b"),  # alike once the unsafe character is replaced
        ("a_b", "a_b-" + "0" * 20),  # the old scheme's digest suffix, forged
        ("Session", "session"),  # alike on a case-insensitive file system
        ("x" * 300 + "1", "x" * 300 + "2"),  # alike in their readable prefix
        ("..", "__"),
    ],
)
def test_lookalike_session_ids_never_share_a_directory(
    tmp_path: Path, one: str, other: str
) -> None:
    scratch = ScratchDirs(tmp_path)
    first, second = scratch.ensure(one), scratch.ensure(other)
    assert first != second
    assert first.name.lower() != second.name.lower()
    assert first.parent == second.parent == tmp_path
    (first / "secret.txt").write_text("mine")
    assert scratch.remove(other) is True
    assert (first / "secret.txt").read_text() == "mine", "the lookalike removed only its own"
    assert scratch.path_for(one) == first, "the same id always maps to the same directory"
    assert len(first.name) < 100


def test_directories_are_private_even_when_made_before(tmp_path: Path) -> None:
    scratch = ScratchDirs(tmp_path)
    created = scratch.ensure("s1")
    assert mode(created) == 0o700
    os.chmod(created, 0o777)  # as directories were made before this rule
    assert scratch.ensure("s1") == created
    assert mode(created) == 0o700


def test_a_planted_symlink_is_neither_followed_nor_removed(tmp_path: Path) -> None:
    scratch = ScratchDirs(tmp_path / "base")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    (tmp_path / "base").mkdir()
    scratch.path_for("s2").symlink_to(victim)

    got = scratch.ensure("s2")
    assert got != scratch.path_for("s2") and got.is_dir() and not got.is_symlink()
    assert mode(got) == 0o700
    assert scratch.ensure("s2") == got, "the session keeps its stand-in directory"
    assert scratch.remove("s2") is True
    assert not got.exists()
    assert (victim / "keep.txt").read_text() == "keep"
    assert scratch.remove("s2") is False, "the planted link is not the session's to remove"
    assert scratch.path_for("s2").is_symlink()


def test_disabled_scratch_hands_out_the_temp_dir(tmp_path: Path) -> None:
    scratch = ScratchDirs(tmp_path, enabled=False)
    assert scratch.ensure("s") != tmp_path / "s"
    assert scratch.remove("s") is False
