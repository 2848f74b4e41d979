"""The production compose file: valid (where a compose client exists) and carrying the settings."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tooltrail.settings import Settings

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


# -- what the file carries (checked without a compose client) ----------------------------------

TOOLTRAIL_SERVICES = ("migrate", "worker", "codec-server")


def compose_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_tooltrail_containers_read_every_setting_from_the_env_file() -> None:
    services = compose_file()["services"]
    for name in TOOLTRAIL_SERVICES:
        service = services[name]
        assert service["env_file"] == [
            {"path": "${TOOLTRAIL_ENV_FILE:-./tooltrail.env}", "required": False}
        ], name
        assert (
            "${TOOLTRAIL_CERTS_DIR:-./deploy/certs}:/etc/tooltrail/certs:ro" in service["volumes"]
        ), name
        # The stack's wiring stays in the compose file (it wins over the env file).
        assert set(service["environment"]) >= {
            "TOOLTRAIL_TEMPORAL_ADDRESS",
            "TOOLTRAIL_DATABASE_URL",
        }, name


def test_the_codec_server_is_a_service_of_its_own_profile() -> None:
    services = compose_file()["services"]
    codec = services["codec-server"]
    assert codec["command"][:2] == ["tooltrail", "codec-server"]
    assert codec["profiles"] == ["codec"]
    assert codec["ports"] == ["${CODEC_SERVER_BIND:-127.0.0.1}:${CODEC_SERVER_PORT:-8081}:8081"]
    assert "TOOLTRAIL_CODEC_SERVER_ORIGINS" in codec["environment"]
    ui = services["temporal-ui"]["environment"]
    assert ui["TEMPORAL_CODEC_ENDPOINT"] == "${TEMPORAL_CODEC_ENDPOINT:-}"
    assert "codec" not in services["worker"].get("profiles", [])


def test_the_env_file_example_lists_every_setting() -> None:
    text = (ROOT / "deploy" / "tooltrail.env.example").read_text()
    listed = set(re.findall(r"^#? ?((?:TOOLTRAIL|OTEL)_[A-Z0-9_]+)=", text, re.MULTILINE))
    wired = set(compose_file()["x-tooltrail-environment"])
    expected = {f"TOOLTRAIL_{name.upper()}" for name in Settings.model_fields}
    missing = expected - listed - wired
    assert not missing, f"add to deploy/tooltrail.env.example: {sorted(missing)}"
    # The OpenTelemetry variables tooltrail's setup reads.
    assert {
        "OTEL_SERVICE_NAME",
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_SDK_DISABLED",
    } <= listed


def test_secrets_of_the_stack_stay_out_of_git_and_the_image() -> None:
    for ignore in (".gitignore", ".dockerignore"):
        lines = (ROOT / ignore).read_text().splitlines()
        assert "tooltrail.env" in lines, ignore
    assert "deploy/certs" in (ROOT / ".dockerignore").read_text().splitlines()
