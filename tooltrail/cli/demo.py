"""A small tool set and a scripted agent turn, for ``tooltrail demo`` and ``tooltrail dev``.

``host`` is importable as ``tooltrail.cli.demo:host`` (e.g. ``tooltrail worker --tools
tooltrail.cli.demo:host``).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field

from tooltrail.core.results import ToolCall
from tooltrail.errors import ToolError
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response
from tooltrail.pipeline.host import Host
from tooltrail.tools import ToolContext, tool

__all__ = ["SCRIPTED_TURN", "host", "scripted_agent_model"]

_OPERATORS: dict[type[ast.AST], Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_evaluate(node.operand)))
    raise ToolError("only numbers and + - * / ** are supported")


@tool
def calculate(expression: Annotated[str, Field(max_length=200)]) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / ** and parentheses, e.g. "(2 + 3) * 7".
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from exc
    value = _evaluate(tree)
    return str(int(value)) if value.is_integer() else str(value)


@tool(concurrent_safe=True, resource_key=lambda args: args.get("name"))
async def write_note(ctx: ToolContext, name: str, text: str) -> str:
    """Save a note in the session's scratch directory.

    Args:
        ctx: the call's context (the session's scratch directory).
        name: the note's file name (letters, digits, '-' and '_').
        text: what to write.
    """
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ToolError(f"invalid note name {name!r}: use letters, digits, '-' and '_'")
    (ctx.temp_dir / f"{name}.txt").write_text(text, encoding="utf-8")
    return f"saved {len(text)} characters to note {name!r}"


@tool(concurrent_safe=True)
async def read_note(ctx: ToolContext, name: str) -> str:
    """Read a note saved earlier in this session.

    Args:
        ctx: the call's context (the session's scratch directory).
        name: the note's name.
    """
    path = ctx.temp_dir / f"{name}.txt"
    if not path.is_file():
        existing = sorted(p.stem for p in ctx.temp_dir.glob("*.txt"))
        raise ToolError(f"no note named {name!r}; notes: {', '.join(existing) or 'none'}")
    return path.read_text(encoding="utf-8")


@tool
def word_count(text: str) -> dict[str, int]:
    """Count the words and characters of a text.

    Args:
        text: the text.
    """
    return {"words": len(text.split()), "characters": len(text)}


@tool
def fetch_weather(city: str) -> str:
    """Return the weather of a city (the demo's deliberately broken tool).

    Args:
        city: the city.
    """
    raise ConnectionError(f"weather service unreachable for {city}")


host = Host([calculate, write_note, read_note, word_count, fetch_weather])
"""The demo host: five tools, default wiring."""

SCRIPTED_TURN = [
    ToolCall("call_1", "write_note", {"name": "plan", "text": "Ship tooltrail. Audit everything."}),
    ToolCall("call_2", "read_note", '{"name": "plan"}'),
    ToolCall("call_3", "calculate", {"expression": "(2 + 3) * 7"}),
    ToolCall("call_4", "word_count", {"text": "durable tool calls for agents"}),
    ToolCall("call_5", "read_note", {"name": "missing"}),
    ToolCall("call_6", "fetch_weather", {"city": "Lisbon"}),
    ToolCall("call_7", "send_email", {"to": "ops@example.com"}),
    ToolCall("call_8", "calculate", '{"expression": '),
]
"""What a model might answer in one turn: successes, soft errors and an unknown tool."""


def scripted_agent_model() -> ScriptedModel:
    """A model that plans, uses the tools over three turns, then answers."""
    return ScriptedModel(
        [
            tool_call_response(
                (
                    "a1",
                    "write_note",
                    {"name": "facts", "text": "tooltrail makes tool calls durable"},
                ),
                ("a2", "calculate", {"expression": "6 * 7"}),
            ),
            tool_call_response(
                ("a3", "read_note", {"name": "facts"}), ("a4", "fetch_weather", {"city": "Oslo"})
            ),
            tool_call_response(
                ("a5", "word_count", {"text": "tooltrail makes tool calls durable"})
            ),
            text_response(
                "The note says tooltrail makes tool calls durable (5 words); 6 * 7 = 42; "
                "the weather service is down."
            ),
        ]
    )
