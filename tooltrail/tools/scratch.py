"""Session scratch directories (``{tmp}/tooltrail-{session}-{digest}``), per worker host.

A session id is caller data and the directories live in a shared place (the system temp dir
by default), so two rules hold:

- one directory per *exact* session id: the name ends with a digest of the whole id, so ids
  that read alike once unsafe characters are replaced (``a/b`` and ``a_b``), differ only in
  case, or are long and share a prefix never share (or remove) each other's directory; the
  readable part is only there for people looking at the temp dir;
- private to the worker's user: created with mode ``0700``; a directory already there that
  is not a plain directory of this user (planted by someone else, or a symlink) is never
  used: the session then gets a fresh private directory of its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["ScratchDirs"]

log = logging.getLogger("tooltrail.scratch")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# The readable part of a directory name; the digest keeps it unique. File names are limited
# to 255 bytes, and a session id has no length limit.
_READABLE_CHARS = 48
_MODE = 0o700


def _digest(session_id: str) -> str:
    # 80 bits: collisions between real session ids are out of reach; this is no secret.
    return hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is a real directory (not a symlink) owned by this process's user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


class ScratchDirs:
    """Creates session scratch directories lazily and removes them best-effort."""

    def __init__(self, base: Path | None = None, *, enabled: bool = True) -> None:
        """Manage directories under ``base`` (default: the system temp dir).

        Args:
            base: where the directories go.
            enabled: ``False`` opts out; tools then get the system temp dir.
        """
        self.base = base
        self.enabled = enabled
        # Sessions whose path was taken by someone else: their private stand-in directories.
        self._moved: dict[str, Path] = {}

    def path_for(self, session_id: str) -> Path:
        """Return the session's directory path (not created): unique per exact session id."""
        base = self.base or Path(tempfile.gettempdir())
        readable = _UNSAFE.sub("_", session_id)[:_READABLE_CHARS]
        return base / f"tooltrail-{readable}-{_digest(session_id)}"

    def ensure(self, session_id: str) -> Path:
        """Create the session's private directory if needed and return it.

        Falls back to a fresh private directory when the session's path is taken by
        something that is not this user's directory, and to the system temp dir when no
        directory can be created at all.
        """
        if not self.enabled:
            return Path(tempfile.gettempdir())
        moved = self._moved.get(session_id)
        if moved is not None and _is_ours(moved):
            return moved
        path = self.path_for(session_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                path.mkdir(mode=_MODE)
            except FileExistsError:
                if not _is_ours(path):
                    return self._elsewhere(session_id, path)
            # mkdir's mode is cut by the umask only, never widened; an older directory (made
            # before this rule) is narrowed here.
            os.chmod(path, _MODE)
        except OSError:
            log.warning("cannot create scratch directory %s; using the temp dir", path)
            return Path(tempfile.gettempdir())
        return path

    def _elsewhere(self, session_id: str, path: Path) -> Path:
        log.warning(
            "scratch directory %s exists but is not a directory of this user; "
            "the session gets a private directory elsewhere",
            path,
        )
        moved = Path(tempfile.mkdtemp(prefix=f"{path.name}-"))  # mode 0700, a unique name
        self._moved[session_id] = moved
        return moved

    def remove(self, session_id: str) -> bool:
        """Remove the session's directory; return whether one was removed. Never raises.

        Only a directory of this user is removed: a symlink or another user's directory at
        the session's path is left alone.
        """
        if not self.enabled:
            return False
        path = self._moved.pop(session_id, None) or self.path_for(session_id)
        if not os.path.lexists(path):
            return False
        if not _is_ours(path):
            log.warning("not removing %s: not a scratch directory of this user", path)
            return False
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("cannot remove scratch directory %s: %s", path, exc)
            return False
        return True
