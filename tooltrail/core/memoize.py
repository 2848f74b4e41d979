"""Memoization (spec §12, ``MemoizingMiddleware``): a session-scoped cache of tool results.

The cache spans the turns of a session, and session state must never live in worker memory
(spec §0 rule 5), so it lives in workflow state and is saved with the session; a hit is
served by the workflow and schedules no activity. The host-wired ``MemoizingMiddleware`` is
the configuration; inside the tool activity's pipeline it passes calls straight through.
Its paths (for write-tool eviction) are host code, so they are evaluated when the turn starts,
like the concurrency verdicts. The pure parts here run in workflow code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field

from tooltrail.core.results import Part, TextPart
from tooltrail.core.text import canonical_json, stable_hash

__all__ = [
    "MEMO_CACHE_BYTES",
    "MemoCache",
    "MemoEntry",
    "MemoPlan",
    "MemoizingMiddleware",
    "with_cached_marker",
]

MEMO_CACHE_BYTES = 256 * 1024
"""Bytes of outputs a session's cache keeps at most; the oldest entries go first beyond it.

The cache is session state: it rides in every turn's plan and final write, so it must stay
small whatever the calls (ten 240 KB lookups must not brick the session)."""


class MemoizingMiddleware:
    """Cache successful results of read-like tools for the rest of the session.

    Registered first, memoization runs in workflow code, before the tool activity: a hit
    schedules nothing. Registered after other layers, a hit is served at its place in the
    tool activity's pipeline, so the layers before it handle the cached result too. Errors
    are never cached, write tools' results never, and a successful write evicts the entries
    whose paths intersect its own.
    """

    def __init__(
        self,
        tools: Iterable[str],
        *,
        write_tools: Iterable[str] = (),
        path_extractor: Callable[[str, dict[str, Any]], Iterable[str]] | None = None,
        ttl_turns: int = 5,
    ) -> None:
        """Configure the cache.

        Args:
            tools: the tools whose successful results are cached.
            write_tools: tools whose successful calls evict cached entries they touch.
            path_extractor: ``(tool, arguments) -> paths`` touched by a call (exact string
                equality decides intersection); without it writes evict nothing.
            ttl_turns: an entry expires ``ttl_turns`` turns after it was stored (0 disables).
        """
        self.tools = frozenset(tools)
        self.write_tools = frozenset(write_tools)
        self.path_extractor = path_extractor
        self.ttl_turns = ttl_turns

    async def __call__(self, call: Any, call_next: Any) -> Any:
        """Pass through: the workflow or the tool activity serves hits in its place."""
        return await call_next(call)

    def plan(self, *, outermost: bool = True) -> MemoPlan:
        """The configuration as the workflow receives it.

        Args:
            outermost: whether this layer is registered first (see ``MemoPlan.outermost``).
        """
        return MemoPlan(
            tools=sorted(self.tools),
            write_tools=sorted(self.write_tools),
            ttl_turns=self.ttl_turns,
            outermost=outermost,
        )

    def paths(self, tool: str, arguments: dict[str, Any]) -> list[str]:
        """The paths a call touches (only for cached and write tools)."""
        if self.path_extractor is None or (tool not in self.tools and tool not in self.write_tools):
            return []
        return sorted(set(self.path_extractor(tool, arguments)))


class MemoPlan(BaseModel):
    """What the workflow must know of the host's ``MemoizingMiddleware``."""

    tools: list[str] = Field(default_factory=list)
    write_tools: list[str] = Field(default_factory=list)
    ttl_turns: int = 5
    outermost: bool = True
    """The memoize layer is registered first: the workflow serves hits, scheduling nothing.
    Otherwise a hit is served at the layer's place in the tool activity's pipeline, so the
    layers registered before it see it (spec §12: observable order = registration order)."""


class MemoEntry(BaseModel):
    """One cached result."""

    tool: str
    key: str
    """Stable hash of the canonical JSON input."""
    output: str | list[Part]
    duration_ms: float
    resolved_tool_name: str
    display_hint: str | None = None
    inserted_turn: int
    paths: list[str] = Field(default_factory=list)


def _size(entry: MemoEntry) -> int:
    """Characters of an entry's output (text, or the parts' JSON): a cheap, stable measure."""
    if isinstance(entry.output, str):
        return len(entry.output)
    return sum(len(part.model_dump_json()) for part in entry.output)


def _key(arguments: dict[str, Any]) -> str:
    return stable_hash(canonical_json(arguments)) or ""


def with_cached_marker(output: str | list[Part]) -> str | list[Part]:
    r"""A hit's output: ``\n[cached]`` appended to text, or an extra ``[cached]`` part."""
    if isinstance(output, str):
        return output + "\n[cached]"
    return [*output, TextPart("[cached]")]


class MemoCache(BaseModel):
    """The session's cache: pure operations, deterministic, serialisable."""

    entries: list[MemoEntry] = Field(default_factory=list)

    def lookup(
        self, plan: MemoPlan, tool: str, arguments: dict[str, Any], turn: int
    ) -> MemoEntry | None:
        """Return the live entry for this call, if any."""
        if tool not in plan.tools:
            return None
        key = _key(arguments)
        for entry in self.entries:
            if entry.tool == tool and entry.key == key and self._live(plan, entry, turn):
                return entry
        return None

    def remember(
        self,
        plan: MemoPlan,
        *,
        tool: str,
        arguments: dict[str, Any],
        output: str | list[Part],
        duration_ms: float,
        resolved_tool_name: str,
        display_hint: str | None,
        turn: int,
        paths: list[str],
    ) -> None:
        """Store a successful result of a cached tool (replacing an older one)."""
        if tool not in plan.tools or tool in plan.write_tools or plan.ttl_turns <= 0:
            return
        key = _key(arguments)
        self.entries = [e for e in self.entries if not (e.tool == tool and e.key == key)]
        self.entries.append(
            MemoEntry(
                tool=tool,
                key=key,
                output=output,
                duration_ms=duration_ms,
                resolved_tool_name=resolved_tool_name,
                display_hint=display_hint,
                inserted_turn=turn,
                paths=paths,
            )
        )

    def over(self, max_bytes: int) -> bool:
        """Whether the entries' outputs hold more than ``max_bytes``."""
        return sum(_size(entry) for entry in self.entries) > max_bytes

    def trim(self, max_bytes: int) -> None:
        """Drop the oldest entries until the outputs hold at most ``max_bytes``."""
        sizes = [_size(entry) for entry in self.entries]
        total = sum(sizes)
        start = 0
        while total > max_bytes and start < len(sizes):
            total -= sizes[start]
            start += 1
        del self.entries[:start]

    def written(self, plan: MemoPlan, tool: str, paths: list[str]) -> None:
        """A successful write: evict the entries whose paths intersect its own."""
        if tool not in plan.write_tools or not paths:
            return
        touched = set(paths)
        self.entries = [e for e in self.entries if touched.isdisjoint(e.paths)]

    def expire(self, plan: MemoPlan, turn: int) -> None:
        """Drop entries whose time is up."""
        self.entries = [e for e in self.entries if self._live(plan, e, turn)]

    @staticmethod
    def _live(plan: MemoPlan, entry: MemoEntry, turn: int) -> bool:
        return turn - entry.inserted_turn < plan.ttl_turns
