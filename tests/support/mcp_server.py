"""A tiny MCP server for the tests: ``slow(seconds)`` and ``broken()``.

Runs over stdio by default, or streamable HTTP with ``--http PORT``. Two environment
variables let tests watch and steer its life:

- ``MCP_TEST_PID_FILE``: the server appends its pid there on start (one line per start, so
  a test sees a restart);
- ``MCP_TEST_REFUSE_FILE``: while that file exists, the server exits at once (a server that
  cannot be restarted).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

BROKEN_MESSAGE = "the flux capacitor is broken"

server = MCPServer("tooltrail-test", log_level="WARNING")


@server.tool()
async def slow(seconds: float) -> str:
    """Wait ``seconds``, then say so."""
    await anyio.sleep(seconds)
    return f"slept {seconds:g}s in {os.getpid()}"


@server.tool()
def broken() -> str:
    """Always fail."""
    # ToolError, not any exception: MCPServer sends only a ToolError's text to the client.
    raise ToolError(BROKEN_MESSAGE)


def main() -> None:
    refuse = os.environ.get("MCP_TEST_REFUSE_FILE")
    if refuse and Path(refuse).exists():
        sys.exit(3)
    pid_file = os.environ.get("MCP_TEST_PID_FILE")
    if pid_file:
        with open(pid_file, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
