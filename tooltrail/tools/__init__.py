"""Defining tools: ``@tool``, ``ToolContext``, ``ToolRegistry`` and dynamic tools.

A static tool's parameters become a generated pydantic model (frozen, no inf/NaN), so the JSON
schema, the validation and the coercion of arguments all come from the function's type hints.
``Tool.validate`` runs the guardrail pipeline of spec §4.2 (validate raw, materialize once,
validate effective, freeze) and returns a ``Snapshot``; ``Tool.invoke`` runs the body on deep
copies of it. A dynamic tool (``ToolRegistry.register_dynamic``) offers the same two methods,
but passes the raw arguments through unvalidated: its remote side owns validation.

These modules run worker-side and client-side, never in workflow code. The names below live
in private modules: ``_context`` (``ToolContext``), ``_snapshot`` (``Snapshot``,
``canonical_json``), ``_catalog`` (``ToolSpec``, schemas and descriptions), ``_rejections``
(``ArgumentsRejected`` and the guardrail text), ``_guard_plumbing`` (the limits a field
carries), ``_tool`` (``Tool``), ``_dynamic`` (``DynamicTool``), ``_decorator`` (``@tool``,
``to_output``) and ``_registry`` (``ToolRegistry``, ``UnknownToolError``).

This package is what an application writes: tools (here), guards, access, idempotency,
MCP toolsets, scratch directories and body lanes. May import: ``tooltrail.errors``,
``tooltrail.core`` and ``tooltrail.settings``; never the database, the pipeline or Temporal's
worker.
"""

from tooltrail.tools._catalog import ToolSpec
from tooltrail.tools._context import ToolContext
from tooltrail.tools._decorator import to_output as to_output
from tooltrail.tools._decorator import tool
from tooltrail.tools._dynamic import DynamicHandler, DynamicTool
from tooltrail.tools._registry import ToolRegistry, UnknownToolError
from tooltrail.tools._rejections import GUARDRAIL_PREFIX, ArgumentsRejected, guardrail_text
from tooltrail.tools._snapshot import Snapshot, canonical_json
from tooltrail.tools._tool import Tool

__all__ = [
    "GUARDRAIL_PREFIX",
    "ArgumentsRejected",
    "DynamicHandler",
    "DynamicTool",
    "Snapshot",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolSpec",
    "UnknownToolError",
    "canonical_json",
    "guardrail_text",
    "tool",
]
