"""Run the ``tooltrail`` command as a real subprocess, the way an operator would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLTRAIL = [sys.executable, "-m", "tooltrail.cli"]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The subprocess environment: the repository importable, data kept under ``tmp_path``."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "COLUMNS": "200",
        "TOOLTRAIL_CRASH_DIR": str(tmp_path),
        **extra,
    }


def run_cli(
    args: list[str],
    tmp_path: Path,
    *,
    timeout: float = 120,
    input: str | None = None,
    **extra_env: str,
) -> subprocess.CompletedProcess[str]:
    """Run ``tooltrail ARGS`` and return what it printed and its exit status.

    Its stdin is ``input``, or empty: a command that asks never waits on the terminal.
    """
    return subprocess.run(
        [*TOOLTRAIL, *args],
        cwd=ROOT,
        env=env_for(tmp_path, **extra_env),
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def error_lines(stderr: str) -> list[str]:
    """The ``error:`` lines of a command's stderr (a contract: exactly one per failure)."""
    return [line for line in stderr.splitlines() if line.startswith("error: ")]
