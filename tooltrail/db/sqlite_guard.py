"""One worker process per SQLite file, unless the deployment says otherwise.

SQLite is the one-process default: its writers take turns on one file lock. Several worker
processes on one file queue their audit writes behind each other's, and under load a
workflow task waits seconds for the lock, close to SQLite's busy timeout (10 s), after which
writes fail. So a worker takes an exclusive ``flock`` on ``<database>.worker-lock`` at
start-up and holds it until its audit store closes (or its process dies); a second worker
process on the same file is refused with a clear message (PostgreSQL is the database for
several workers).
``TOOLTRAIL_SQLITE_SHARED=true`` lifts the check, for a deployment that accepts the risk
(tests, a light second worker). Workers in one process share the lock.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from sqlalchemy.engine import make_url

from tooltrail.errors import ConfigurationError

__all__ = ["claim_sqlite_file", "lock_path", "release_sqlite_file"]

_held: dict[str, tuple[int, int]] = {}
"""Lock file -> (its open, locked descriptor, how many workers of this process use it)."""
_lock = threading.Lock()


def lock_path(url: str) -> Path | None:
    """The lock file of a SQLite database URL, or ``None`` (not SQLite, or in memory)."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    path = Path(database).expanduser().resolve()
    return path.with_name(path.name + ".worker-lock")


def claim_sqlite_file(url: str) -> None:
    """Make this process the only worker process of the SQLite database at ``url``.

    A no-op for other databases and for a process that already holds the file.

    Raises:
        ConfigurationError: another live process holds the file (its pid is named).
    """
    path = lock_path(url)
    if path is None:
        return
    import fcntl  # POSIX only, and only needed for SQLite workers

    with _lock:
        if str(path) in _held:
            fd, users = _held[str(path)]
            _held[str(path)] = (fd, users + 1)
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = f" (pid {int(os.pread(fd, 32, 0).split()[0])})"
            os.close(fd)
            raise ConfigurationError(
                f"another tooltrail worker{holder} already uses the SQLite database "
                f"{str(path)[: -len('.worker-lock')]!r}: SQLite is the one-process default. "
                "Run several workers on PostgreSQL (TOOLTRAIL_DATABASE_URL="
                "postgresql+asyncpg://...), or set TOOLTRAIL_SQLITE_SHARED=true to share the "
                "file anyway (audit writes then queue on its lock)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[str(path)] = (fd, 1)


def release_sqlite_file(url: str) -> None:
    """Give back one ``claim_sqlite_file`` of this process; the last one unlocks the file."""
    path = lock_path(url)
    if path is None:
        return
    with _lock:
        held = _held.get(str(path))
        if held is None:
            return
        fd, users = held
        if users > 1:
            _held[str(path)] = (fd, users - 1)
            return
        del _held[str(path)]
        os.close(fd)  # closing the descriptor releases the flock
