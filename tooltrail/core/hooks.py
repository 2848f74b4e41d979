"""Hooks (spec §7): host-wired user code before and after each attempt.

Pre-tool hooks return ``Allow()``, ``Block(reason)``, ``Ask(message)`` or ``None``; the first
``Block`` or ``Ask`` wins. Hooks run worker-side (inside the tool activity, sharing its round
trip); their decisions are recorded in workflow history, so replay never runs them again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

__all__ = [
    "Allow",
    "Ask",
    "Block",
    "HookDecision",
    "PostToolHook",
    "PostToolUseContext",
    "PreToolHook",
    "PreToolUseContext",
    "expired_ask_text",
    "headless_ask_text",
    "run_post_hooks",
    "run_pre_hooks",
]

log = logging.getLogger("tooltrail.hooks")


class Allow(BaseModel):
    """Let the call proceed (later hooks still run)."""

    kind: Literal["allow"] = "allow"


class Block(BaseModel):
    """Refuse the call; the model reads ``reason`` verbatim."""

    kind: Literal["block"] = "block"
    reason: str

    def __init__(self, reason: str | None = None, /, **data: Any) -> None:
        """Create a block: ``Block("not on Fridays")``."""
        if reason is not None:
            data["reason"] = reason
        super().__init__(**data)


class Ask(BaseModel):
    """Ask a human first: headless sessions refuse; interactive turns wait for an approval.

    ``expires_in`` (seconds, or a ``timedelta``) is this ask's own deadline: when it passes
    before the turn's ``approval_timeout_s`` with no answer, the call is denied with a
    reason that says the approval expired.
    """

    kind: Literal["ask"] = "ask"
    message: str
    expires_in: float | None = Field(default=None, gt=0)
    """Seconds a human has to answer; ``None``: the turn's ``approval_timeout_s``."""

    def __init__(self, message: str | None = None, /, **data: Any) -> None:
        """Create a question: ``Ask("delete 3 files?", expires_in=300)``."""
        if message is not None:
            data["message"] = message
        if isinstance(data.get("expires_in"), timedelta):
            data["expires_in"] = data["expires_in"].total_seconds()
        super().__init__(**data)


class PreToolUseContext(BaseModel):
    """What a pre-tool hook sees."""

    tool_name: str
    input: dict[str, Any]
    session_id: str
    turn_number: int = 0
    """The turn's number in its session, from 0 (turns that saved the session's state
    before it; the memoize cache counts turns the same way)."""
    tool_call_id: str = ""
    turn_id: str = ""


class PostToolUseContext(BaseModel):
    """What a post-tool hook sees (the attempt's rendered output)."""

    tool_name: str
    input: dict[str, Any]
    output: str
    is_error: bool
    duration_ms: int
    session_id: str
    turn_number: int = 0
    """The turn's number in its session, from 0 (turns that saved the session's state
    before it; the memoize cache counts turns the same way)."""
    tool_call_id: str = ""
    turn_id: str = ""


@runtime_checkable
class PreToolHook(Protocol):
    """A hook consulted before each attempt."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Allow | Block | Ask | None:
        """Return a decision, or ``None`` for no opinion."""
        ...


@runtime_checkable
class PostToolHook(Protocol):
    """A hook told about each attempt's result (not for blocked attempts)."""

    async def post_tool(self, ctx: PostToolUseContext) -> None:
        """React to a result; exceptions are logged and ignored."""
        ...


class HookDecision(BaseModel):
    """The pre-hook verdict that travels back to the workflow."""

    decision: Literal["block", "ask"]
    text: str
    """The block reason, or the question."""
    hook: str
    """Which hook decided (its class name and position)."""
    expires_in: float | None = None
    """An ``Ask``'s own deadline, in seconds (``Ask(expires_in=...)``)."""

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Every byte is history: a decision without a deadline travels as it did before.
        data: dict[str, Any] = handler(self)
        if self.expires_in is None:
            data.pop("expires_in", None)
        return data


def headless_ask_text(message: str) -> str:
    """The refusal text of an ``Ask`` in a non-interactive session (spec §7)."""
    return f"Hook requested confirmation ({message}) but the session is not interactive"


def expired_ask_text(message: str, seconds: float) -> str:
    """The denial of an ``Ask`` whose deadline passed without an answer."""
    return f"Approval expired: nobody answered ({message}) within {seconds:g}s"


def _hook_name(hook: object, index: int) -> str:
    return f"{type(hook).__name__}#{index}"


async def _call(method: Any, ctx: BaseModel, timeout_s: float) -> Any:
    result = method(ctx)
    if inspect.isawaitable(result):
        return await asyncio.wait_for(result, timeout_s)
    return result


async def run_pre_hooks(
    hooks: Sequence[object], ctx: PreToolUseContext, *, timeout_s: float = 30.0
) -> HookDecision | None:
    """Run the pre-tool hooks in order; return the first Block/Ask, or ``None``.

    A hook that raises or times out blocks the call with ``hook error (<Type>): <message>``:
    when a safety check cannot decide, the call must not run.
    """
    for index, hook in enumerate(hooks):
        method = getattr(hook, "pre_tool", None)
        if method is None:
            continue
        name = _hook_name(hook, index)
        try:
            verdict = await _call(method, ctx, timeout_s)
        except TimeoutError:
            log.warning("pre-tool hook %s timed out after %ss", name, timeout_s)
            return HookDecision(
                decision="block",
                text=f"hook error (TimeoutError): no decision within {timeout_s:g}s",
                hook=name,
            )
        except Exception as exc:
            log.warning("pre-tool hook %s raised", name, exc_info=True)
            return HookDecision(
                decision="block", text=f"hook error ({type(exc).__name__}): {exc}", hook=name
            )
        if isinstance(verdict, Block):
            return HookDecision(decision="block", text=verdict.reason, hook=name)
        if isinstance(verdict, Ask):
            return HookDecision(
                decision="ask", text=verdict.message, hook=name, expires_in=verdict.expires_in
            )
    return None


async def run_post_hooks(
    hooks: Sequence[object], ctx: PostToolUseContext, *, timeout_s: float = 30.0
) -> list[str]:
    """Run the post-tool hooks in order; return the errors (logged, never raised)."""
    problems = []
    for index, hook in enumerate(hooks):
        method = getattr(hook, "post_tool", None)
        if method is None:
            continue
        try:
            await _call(method, ctx, timeout_s)
        except Exception as exc:
            name = _hook_name(hook, index)
            log.warning("post-tool hook %s raised; ignored", name, exc_info=True)
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems
