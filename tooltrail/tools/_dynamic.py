"""Dynamic tools: ``DynamicTool`` and its ``DynamicHandler``.

A dynamic tool is registered at runtime with a JSON schema and an async handler; its
arguments pass through unvalidated, as its remote side owns validation.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from tooltrail.errors import ToolDefinitionError
from tooltrail.tools._context import ToolContext
from tooltrail.tools._rejections import ArgumentsRejected
from tooltrail.tools._snapshot import Snapshot
from tooltrail.tools._tool import _NAME, Tool
from tooltrail.tools.body_lanes import run_sync_body

__all__ = ["DynamicHandler", "DynamicTool"]


def _is_async_callable(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  (an object with an async __call__)
    )


DynamicHandler = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
"""``async (arguments, ctx) -> JSON value``: the body of a dynamic tool."""


class _DynamicArguments(BaseModel):
    """Placeholder parameter model of dynamic tools (their arguments are never validated)."""

    model_config = ConfigDict(frozen=True, extra="allow")


class DynamicTool(Tool):
    """A tool registered at runtime with a JSON schema and an async handler.

    For example a remote MCP tool's proxy; see ``ToolRegistry.register_dynamic``.

    Its arguments are not validated against the schema (the remote side owns that), it runs
    no guardrails and is never idempotent; the handler gets a deep copy of the raw arguments.
    It has the interface of a static ``Tool``, so the tool activity runs it the same way.
    """

    kind: ClassVar[Literal["static", "dynamic"]] = "dynamic"

    def __init__(
        self,
        name: str,
        *,
        description: str,
        parameters: Mapping[str, Any],
        handler: DynamicHandler,
    ) -> None:
        """Create the tool (prefer ``registry.register_dynamic``).

        Raises:
            ToolDefinitionError: the name is invalid, or ``parameters`` is not a JSON object.
            TypeError: ``handler`` is not callable or ``description`` is not a string.
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolDefinitionError(
                f"dynamic tool name {name!r} is invalid: "
                "use 1-64 characters from A-Z, a-z, 0-9, '_' and '-'"
            )
        if not callable(handler):
            raise TypeError(f"the handler of dynamic tool {name!r} is not callable: {handler!r}")
        if not isinstance(description, str):
            raise TypeError(f"the description of dynamic tool {name!r} must be a str")
        if not isinstance(parameters, Mapping):
            raise ToolDefinitionError(
                f"the parameters of dynamic tool {name!r} must be a JSON Schema object"
            )
        try:
            self._parameters: dict[str, Any] = json.loads(json.dumps(dict(parameters)))
        except (TypeError, ValueError) as exc:
            raise ToolDefinitionError(
                f"the parameters of dynamic tool {name!r} are not JSON-serialisable: {exc}"
            ) from exc
        self.fn = handler
        self._func = handler
        self.name = name
        self.description = description
        self.concurrent_safe = False
        self.resource_key = None
        self._declared_idempotent = False
        self._declared_guard = None
        self._globals = None
        self._owner = None
        self._attr = None
        self._instance = None
        self.timeout_s = None
        self.retry_on_interrupt = True
        # Dynamic handlers (MCP sessions, say) hold objects bound to the worker's loop.
        self.own_loop = False
        self.local = False
        self.loop_thresholds = None
        self.primary_param = None
        self.loop_suggestion = None
        self.is_async = _is_async_callable(handler)
        self.context_param = None
        self._model_param = None
        self.is_method = False
        self.params_model = _DynamicArguments
        self.extra = "allow"
        self._declared_keys = frozenset()

    def parameters_schema(self) -> dict[str, Any]:
        """Return the schema exactly as registered (a copy)."""
        return copy.deepcopy(self._parameters)

    def validate(self, arguments: Mapping[str, Any] | None) -> Snapshot:
        """Return a snapshot holding a deep copy of the raw arguments; nothing is checked.

        Raises:
            ArgumentsRejected: only if ``arguments`` is not a mapping at all.
        """
        raw: Any = {} if arguments is None else arguments
        if not isinstance(raw, Mapping):
            raise ArgumentsRejected.of(["(arguments): not a valid object"], stage="raw")
        arguments = copy.deepcopy(dict(raw))
        model = _DynamicArguments.model_construct()
        # Extras only, never validated: the placeholder just carries the raw arguments.
        object.__setattr__(model, "__pydantic_extra__", dict(arguments))
        return Snapshot(model=model, canonical=None, arguments=arguments, kind="dynamic")

    async def invoke(
        self, ctx: ToolContext, snapshot: Snapshot | BaseModel | Mapping[str, Any]
    ) -> Any:
        """Run the handler on a deep copy of the snapshot's raw arguments."""
        if isinstance(snapshot, Snapshot):
            if snapshot.arguments is None:
                raise TypeError(
                    f"dynamic tool {self.name!r} needs a snapshot of its own validate()"
                )
            arguments = copy.deepcopy(dict(snapshot.arguments))
        elif isinstance(snapshot, BaseModel):
            arguments = snapshot.model_dump(mode="json")
        else:
            arguments = copy.deepcopy(dict(snapshot))
        if self.is_async:
            return await self.fn(arguments, ctx)
        result = await run_sync_body(self.name, functools.partial(self.fn, arguments, ctx))
        if inspect.isawaitable(result):
            result = await result
        return result
