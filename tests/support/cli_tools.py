"""Tools and hooks for the command-line contract tests (``--tools tests.support.cli_tools:host``).

The worker runs in the test process; the ``tooltrail`` subprocess imports this module only
to describe the tools to the turns it starts. ``behaviour`` steers the in-process tools.
"""

from __future__ import annotations

from typing import Any

from tooltrail import Allow, Ask, Block, Host, PreToolUseContext, ToolContext, tool

behaviour: dict[str, Any] = {"suffix": "v1", "block": False}


@tool
def lookup(key: str) -> str:
    """Answer from 'the world', which may change between runs."""
    return f"{key}={behaviour['suffix']}"


@tool
def echo(ctx: ToolContext, text: str) -> str:
    """Echo the text back."""
    return text


@tool
def transfer(amount: int) -> str:
    """Move money: a human approves every call."""
    return f"moved {amount}"


class Gatekeeper:
    """Asks a human before every ``transfer``; blocks ``lookup`` while ``behaviour['block']``."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        """Decide."""
        if ctx.tool_name == "transfer":
            return Ask(f"move {ctx.input.get('amount')}?")
        if ctx.tool_name == "lookup" and behaviour["block"]:
            return Block("lookups are off today")
        return Allow()


host = Host([lookup, echo, transfer], hooks=[Gatekeeper()])
