"""The arguments of one call as ``validate`` accepted them: ``Snapshot``.

Also ``canonical_json``, the canonical JSON bytes a static tool's snapshot carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from tooltrail.core.text import canonical_json as canonical_text

__all__ = ["Snapshot", "canonical_json"]


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of a JSON value: sorted keys, no spaces, UTF-8, no NaN.

    Raises:
        ValueError: ``value`` holds NaN or an infinity.
        TypeError: ``value`` is not JSON data.
    """
    return canonical_text(value).encode("utf-8")


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The arguments of one call, as ``validate`` accepted them; pass it to ``invoke``.

    For a static tool it is the *effective snapshot* of spec §4.3: the materialized model plus
    its canonical bytes, computed once. Idempotency keys and the audit row's
    ``effective_arguments`` come from ``canonical``; the body gets deep copies of ``model``.
    For a dynamic tool ``canonical`` is ``None`` (no step 3d ran) and ``arguments`` holds a
    deep copy of the raw arguments.
    """

    model: BaseModel
    """The frozen parameter model. For a dynamic tool, a placeholder holding the raw
    arguments as extras (``model.model_dump()`` returns them); nothing was validated."""
    canonical: bytes | None
    """``canonical_json(model.model_dump(mode="json"))`` (static tools), else ``None``."""
    ignored_arguments: tuple[str, ...] = ()
    """Undeclared argument names that were dropped (``extra="ignore"``), in arrival order."""
    arguments: Mapping[str, Any] | None = None
    """Dynamic tools: a deep copy of the raw arguments (the handler gets another copy)."""
    kind: Literal["static", "dynamic"] = "static"
    """Which kind of tool produced the snapshot."""

    @property
    def effective_arguments(self) -> str | None:
        """The canonical JSON text for the audit row, or ``None`` (dynamic tools)."""
        return None if self.canonical is None else self.canonical.decode("utf-8")
