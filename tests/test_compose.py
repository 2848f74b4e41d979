"""The production compose file stays valid (when a docker compose client is available)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not compose_available(), reason="no `docker compose` client on this machine")
def test_docker_compose_config_validates() -> None:
    done = subprocess.run(
        ["docker", "compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
