"""Tool catalogs in any of the formats the registry produces, normalized for each provider.

The workflow does not know which provider the worker talks to, so a request may carry
``ToolRegistry.openai_tools()`` or ``anthropic_tools()`` (or plain ``{name, description,
parameters}`` entries); each client converts to its own format here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tooltrail.core.messages import Message

__all__ = [
    "CatalogEntry",
    "arguments_json",
    "arguments_object",
    "read_catalog",
    "tool_result_text",
]

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class CatalogEntry:
    """One tool of a catalog, in no provider's format."""

    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """Return the entry in OpenAI's ``tools`` format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def anthropic(self) -> dict[str, Any]:
        """Return the entry in Anthropic's ``tools`` format."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


def _entry(item: dict[str, Any]) -> CatalogEntry:
    spec = item["function"] if isinstance(item.get("function"), dict) else item
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool catalog entry without a name: {item!r}")
    schema = spec.get("parameters", spec.get("input_schema"))
    return CatalogEntry(
        name=name,
        description=str(spec.get("description") or ""),
        parameters=dict(schema) if isinstance(schema, dict) else dict(_EMPTY_SCHEMA),
    )


def read_catalog(tools: list[dict[str, Any]]) -> list[CatalogEntry]:
    """Return the entries of a catalog in OpenAI, Anthropic or plain format.

    Raises:
        ValueError: an entry has no name.
    """
    return [_entry(item) for item in tools]


def arguments_json(arguments: dict[str, Any] | str) -> str:
    """Return call arguments as JSON text; raw text is sent back exactly as the model wrote it."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def arguments_object(arguments: dict[str, Any] | str) -> dict[str, Any]:
    """Return call arguments as a JSON object; raw text that is not one becomes ``{}``.

    Anthropic requires an object as a ``tool_use`` input; a call whose text did not parse
    was answered with an ``invalid arguments`` soft error, which tells the model what failed.
    """
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def tool_result_text(message: Message) -> str:
    """Return the text of a tool message as the provider receives it.

    A failed call whose output is blank (``ToolError("")``) says so in a fixed text:
    Anthropic refuses an empty ``is_error`` result, and either model reads nothing useful
    from one.
    """
    if message.is_error and not message.content.strip():
        if message.name:
            return f"tool {message.name!r} failed without a message"
        return "the tool failed without a message"
    return message.content
