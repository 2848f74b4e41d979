"""Settings from the environment (``TOOLTRAIL_*``) and an optional ``.env`` file."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "default_data_dir"]


def default_data_dir() -> Path:
    """Return where the embedded stack keeps its files (``$XDG_DATA_HOME/tooltrail``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tooltrail"


class Settings(BaseSettings):
    """tooltrail's settings; every field reads ``TOOLTRAIL_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="TOOLTRAIL_", env_file=".env", extra="ignore")

    temporal_address: str = "localhost:7233"
    """Temporal frontend address of an existing cluster."""
    namespace: str = "default"
    """Temporal namespace."""
    task_queue: str = "tooltrail"
    """Task queue of the turn workflows and tool activities."""
    database_url: str | None = None
    """Audit database URL; ``None`` means the embedded SQLite file under ``data_dir``."""
    data_dir: Path = Field(default_factory=default_data_dir)
    """Directory of the embedded SQLite file and the embedded server's state."""

    def effective_database_url(self) -> str:
        """Return ``database_url``, or the embedded SQLite file's URL."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'tooltrail.db'}"
