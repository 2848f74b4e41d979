"""Session scratch directories (``{tmp}/tooltrail-{session_id}``), per worker host."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["ScratchDirs"]

log = logging.getLogger("tooltrail.scratch")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


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

    def path_for(self, session_id: str) -> Path:
        """Return the session's directory path (not created)."""
        base = self.base or Path(tempfile.gettempdir())
        safe = _UNSAFE.sub("_", session_id)
        if safe != session_id or safe in {"", ".", ".."}:
            # A session id is caller data: never let it climb out of the base directory.
            digest = hashlib.blake2b(session_id.encode(), digest_size=4).hexdigest()
            safe = f"{safe}-{digest}"
        return base / f"tooltrail-{safe}"

    def ensure(self, session_id: str) -> Path:
        """Create the session's directory if needed; fall back to the system temp dir."""
        if not self.enabled:
            return Path(tempfile.gettempdir())
        path = self.path_for(session_id)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            log.warning("cannot create scratch directory %s; using the temp dir", path)
            return Path(tempfile.gettempdir())
        return path

    def remove(self, session_id: str) -> bool:
        """Remove the session's directory; return whether one was removed. Never raises."""
        if not self.enabled:
            return False
        path = self.path_for(session_id)
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("cannot remove scratch directory %s: %s", path, exc)
            return False
        return True
