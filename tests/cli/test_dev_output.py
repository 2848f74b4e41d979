"""``tooltrail dev`` and ``demo`` never print a database URL's password."""

from __future__ import annotations

import asyncio
import signal
import socket
import uuid
from pathlib import Path

import pytest

from tests.support.cli_runner import ROOT, TOOLTRAIL, env_for, run_cli

PASSWORD = f"pw-{uuid.uuid4().hex}"


def with_password(url: str) -> str:
    # The machine's PostgreSQL trusts local connections, so any password is accepted.
    scheme, _, rest = url.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.postgres
def test_demo_masks_the_password(tmp_path: Path, postgres_url: str) -> None:
    done = run_cli(["demo", "--database-url", with_password(postgres_url)], tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert PASSWORD not in done.stdout + done.stderr
    assert "Audit database: postgresql://postgres:****@" in done.stdout


@pytest.mark.postgres
async def test_dev_masks_the_password(tmp_path: Path, postgres_url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *TOOLTRAIL,
        "dev",
        "--database-url",
        with_password(postgres_url),
        "--port",
        str(free_port()),
        "--ui-port",
        str(free_port()),
        "--no-persist",
        cwd=ROOT,
        env=env_for(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    seen = b""
    try:
        while b"Press Ctrl-C" not in seen:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
            assert line, (seen, await proc.stderr.read())
            seen += line
    finally:
        proc.send_signal(signal.SIGINT)
        rest, errors = await asyncio.wait_for(proc.communicate(), timeout=60)
    printed = (seen + rest + errors).decode()
    assert PASSWORD not in printed
    assert "Audit database: postgresql://postgres:****@" in printed
