"""Catalog entries: ``ToolSpec``, and the schema and description drawn from a function.

The schema loses the titles pydantic generates; the description is the docstring's first
paragraph, and its ``Args:`` entries describe the parameters.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolSpec"]


@dataclass(frozen=True)
class ToolSpec:
    """One catalog entry."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: str = "static"


# Keywords whose values are data (JSON values of the tool's arguments), never sub-schemas:
# a default like {"title": "Mr"} must reach the model unchanged.
_SCHEMA_VALUE_KEYWORDS = frozenset({"default", "const", "enum", "examples", "example"})


def _strip_titles(schema: Any) -> Any:
    # pydantic adds "title" to every object and property; providers do not need them and the
    # model reads every token, so drop the generated ones (a property named "title" stays).
    if isinstance(schema, dict):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            elif key == "title" and isinstance(value, str):
                continue
            elif key in _SCHEMA_VALUE_KEYWORDS:
                out[key] = value
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Return the first paragraph of a docstring and the Google-style ``Args:`` entries."""
    if not doc:
        return "", {}
    text = inspect.cleandoc(doc)
    first = text.split("\n\n", 1)[0].strip()
    if first.startswith(("Args:", "Arguments:")):
        first = ""
    args: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments):\s*\n((?:[ \t]+.*\n?|\n)*)", text, re.MULTILINE)
    if match:
        current: str | None = None
        for line in match.group(1).splitlines():
            entry = re.match(r"^\s{2,}(\*{0,2}\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
            if entry and (current is None or not line.startswith(" " * 8)):
                current = entry.group(1).lstrip("*")
                args[current] = entry.group(2).strip()
            elif current and line.strip():
                args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(first.split()), args
