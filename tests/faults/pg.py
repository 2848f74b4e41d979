"""A throwaway PostgreSQL server of the test's own, which it may stop and start at will.

The machine's shared PostgreSQL (5432) is never touched: ``initdb`` creates a cluster in a
fresh temporary directory, ``pg_ctl`` runs it on a free loopback port with trust auth, and
the cluster is stopped and removed on exit whatever happened. ``initdb`` refuses to run as
root, so as root every PostgreSQL command runs as the ``postgres`` OS user (``runuser``), in
a directory that user owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

__all__ = [
    "PostgresUnavailable",
    "ThrowawayPostgres",
    "check_available",
    "free_port",
    "throwaway_postgres",
]

COMMAND_TIMEOUT_S = 60.0
DATABASE = "tooltrail"
OS_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries (or no way to run them) on this machine."""


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_bin_dir() -> Path:
    """Return the directory of ``initdb``/``pg_ctl`` (the newest installed version).

    ``TOOLTRAIL_TEST_PG_BIN`` overrides the search.

    Raises:
        PostgresUnavailable: no PostgreSQL server binaries were found.
    """
    override = os.environ.get("TOOLTRAIL_TEST_PG_BIN")
    candidates = [Path(override)] if override else []
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(p) for p in sorted(versions, key=_version_key, reverse=True)]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin, "
        "on PATH or in TOOLTRAIL_TEST_PG_BIN"
    )


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


class ThrowawayPostgres:
    """One throwaway cluster: ``url`` names its database; ``stop()``/``start()`` on demand."""

    def __init__(self, bin_dir: Path, root: Path, port: int, run_as: str | None) -> None:
        """Describe the cluster; nothing runs until ``create()``."""
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port = port
        self.run_as = run_as
        self.running = False
        self.url = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"
        self.admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    async def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.root,
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout=COMMAND_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"{program} took over {COMMAND_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {proc.returncode}:\n{output.decode()}\n"
                f"--- server log ---\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log (for failure messages)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def create(self) -> None:
        """``initdb``, start, and create the test database."""
        await self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        await self.start()
        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()

    async def start(self) -> None:
        """Start the server (on the same port and data directory) and wait until it accepts."""
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.root}",
                "-c fsync=off",  # the OS never crashes in these tests; stop -m fast flushes
                "-c max_connections=50",
            ]
        )
        await self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(int(COMMAND_TIMEOUT_S)),
        )
        self.running = True

    async def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m fast``: clients are disconnected at once)."""
        await self._run(
            "pg_ctl",
            "stop",
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(COMMAND_TIMEOUT_S)),
        )
        self.running = False

    async def destroy(self) -> None:
        """Stop the server however it can be stopped, then remove every file."""
        try:
            if (self.data / "postmaster.pid").exists():
                with contextlib.suppress(Exception):
                    await self.stop("immediate")
            self._kill_postmaster()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        # Last resort when pg_ctl could not stop it: the postmaster this cluster started.
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pid_file.read_text().splitlines()[0])
            data_dir = Path(pid_file.read_text().splitlines()[1])
            if data_dir == self.data:
                os.kill(pid, signal.SIGKILL)


def check_available() -> tuple[Path, str | None]:
    """Return the binaries' directory and the OS user to run them as (``None``: ourselves).

    Raises:
        PostgresUnavailable: the server binaries (or a user to run them as) are missing.
    """
    return find_bin_dir(), _os_user()


def _os_user() -> str | None:
    """The OS user PostgreSQL runs as: ourselves, or ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        raise PostgresUnavailable(
            f"running as root and there is no {OS_USER!r} OS user to run initdb as"
        ) from None
    if shutil.which("runuser") is None:
        raise PostgresUnavailable("running as root and runuser is missing")
    return OS_USER


@contextlib.asynccontextmanager
async def throwaway_postgres() -> AsyncIterator[ThrowawayPostgres]:
    """Create, start and yield a throwaway PostgreSQL; always stopped and removed after.

    Raises:
        PostgresUnavailable: the server binaries (or a user to run them as) are missing.
    """
    bin_dir, run_as = check_available()
    root = Path(tempfile.mkdtemp(prefix="tooltrail-pg-"))
    if run_as is not None:
        user = pwd.getpwnam(run_as)
        os.chown(root, user.pw_uid, user.pw_gid)
    server = ThrowawayPostgres(bin_dir, root, free_port(), run_as)
    try:
        await server.create()
        yield server
    finally:
        await server.destroy()
