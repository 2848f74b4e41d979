"""Tools for the crash tests: the first execution kills its own worker process (SIGKILL).

Executions are counted in files under ``$TOOLTRAIL_CRASH_DIR`` so the count survives the
process that dies.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tooltrail import AlwaysRecoverable, Host, PostToolUseContext, ToolError, tool
from tooltrail.core.messages import ModelRequest, ModelResponse
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response


def _record(name: str) -> int:
    directory = Path(os.environ["TOOLTRAIL_CRASH_DIR"])
    with (directory / f"{name}.runs").open("a") as runs:
        runs.write("x")
    return len((directory / f"{name}.runs").read_text())


def _die_first_time(name: str) -> str:
    if _record(name) == 1:
        # Give the activity's first heartbeat (which says the body started) time to leave.
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    return f"{name} survived"


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


@tool
def fragile() -> str:
    """Kill the worker on the first run; succeed after."""
    return _die_first_time("fragile")


@tool(retry_on_interrupt=False)
def fragile_once() -> str:
    """Kill the worker on the first run; must not run a second time."""
    return _die_first_time("fragile_once")


@tool(local=True)
def fragile_local() -> str:
    """Kill the worker on the first run (a local activity); succeed after."""
    return _die_first_time("fragile_local")


def runs(name: str) -> int:
    """How many times a tool body started."""
    path = Path(os.environ["TOOLTRAIL_CRASH_DIR"]) / f"{name}.runs"
    return len(path.read_text()) if path.exists() else 0


@tool
def fails_once() -> str:
    """Fail softly on the first run, succeed after."""
    if _record("fails_once") == 1:
        raise ToolError("first run fails")
    return "second run worked"


@tool(idempotent=True)
def charge(amount: int) -> str:
    """A side effect that must happen at most once."""
    _record("charge")
    return f"charged {amount}"


class KillAfterFirstCharge:
    """Kills the worker right after the first charge committed its idempotent outcome."""

    async def post_tool(self, ctx: PostToolUseContext) -> None:
        if ctx.tool_name == "charge" and runs("charge") == 1 and not _marker("killed"):
            os.kill(os.getpid(), signal.SIGKILL)


def _marker(name: str) -> bool:
    path = Path(os.environ["TOOLTRAIL_CRASH_DIR"]) / name
    if path.exists():
        return True
    path.touch()
    return False


host = Host([echo, fragile, fragile_once, fails_once, fragile_local])
recovering_host = Host([echo, fragile, fragile_once, fails_once], reflector=AlwaysRecoverable())
idempotent_host = Host([echo, charge], hooks=[KillAfterFirstCharge()])
# The doomed worker's model asks for `fragile`, which kills that worker mid-run; the worker
# that takes over only needs the model's final answer.
agent_host = Host([echo, fragile], model=ScriptedModel([tool_call_response(("m1", "fragile", {}))]))


class DyingModel:
    """A model client whose first call kills its worker (before any answer is stored)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Die on the first call; answer after."""
        return text_response(_die_first_time("model"))


dying_model_host = Host([echo], model=DyingModel())
HOSTS = {
    "plain": host,
    "recovering": recovering_host,
    "idempotent": idempotent_host,
    "agent": agent_host,
    "dying_model": dying_model_host,
}
