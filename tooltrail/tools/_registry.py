"""The tools a worker can run: ``ToolRegistry``, and ``UnknownToolError`` for a name it lacks.

The registry holds static and dynamic tools by exact name and gives the catalog in the
providers' formats.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tooltrail.errors import DuplicateToolError, RegistryFrozenError, TooltrailError
from tooltrail.tools._catalog import ToolSpec
from tooltrail.tools._dynamic import DynamicHandler, DynamicTool
from tooltrail.tools._tool import Tool

__all__ = ["ToolRegistry", "UnknownToolError"]


class UnknownToolError(TooltrailError, KeyError):
    """Raised when a name resolves to no registered tool (exact, case-sensitive match).

    ``str(e)`` is exactly ``unknown tool: '<name>'`` (``KeyError`` would add quotes).
    """

    def __init__(self, tool_name: str) -> None:
        """Create the error for ``tool_name``."""
        super().__init__(f"unknown tool: '{tool_name}'")
        self.tool_name = tool_name

    def __str__(self) -> str:
        return f"unknown tool: '{self.tool_name}'"


class ToolRegistry:
    """The tools a worker can run, by exact, case-sensitive name.

    Static and dynamic tools share one namespace.
    """

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        """Create a registry and register ``tools`` in order."""
        self._tools: dict[str, Tool] = {}
        self._frozen = False
        for item in tools:
            self.register(item)

    def _admit(self, item: Tool, pending: Mapping[str, Tool] | None = None) -> None:
        if not isinstance(item, Tool):
            raise TypeError(f"expected a Tool (decorate {item!r} with @tool), got {type(item)}")
        item.check_definition()
        if self._frozen:
            raise RegistryFrozenError(
                f"cannot register {item.name!r}: a worker was built on this registry; "
                "register every tool before building the worker"
            )
        if item.name in self._tools or (pending is not None and item.name in pending):
            raise DuplicateToolError(f"a tool named {item.name!r} is already registered")

    def register(self, item: Tool) -> Tool:
        """Add a tool (static or dynamic).

        Raises:
            DuplicateToolError: the name is taken.
            RegistryFrozenError: a worker was already built on this registry.
            ToolDefinitionError: the module's ``TOOLTRAIL_DEFAULTS`` is not a ``ToolDefaults``.
            TypeError: ``item`` is not a ``Tool`` (decorate the function with ``@tool``), or
                is a method tool read from its class instead of an instance.
        """
        self._admit(item)
        self._tools[item.name] = item
        return item

    def register_dynamic(
        self,
        name: str,
        *,
        description: str,
        parameters: Mapping[str, Any],
        handler: DynamicHandler,
        **unsupported: Any,
    ) -> DynamicTool:
        """Add a dynamic tool: a name, a description, a JSON Schema and an async handler.

        The handler, ``async (arguments: dict, ctx: ToolContext) -> JSON value``, gets a deep
        copy of the raw arguments; they are not validated against ``parameters``, which the
        catalog returns exactly as given.

        Raises:
            TypeError: ``idempotent`` or ``guard`` was given (a dynamic tool has nothing to
                carry them), or another unknown keyword.
            DuplicateToolError: the name is taken (by a static or a dynamic tool).
            RegistryFrozenError: a worker was already built on this registry.
            ToolDefinitionError: the name is invalid or ``parameters`` is not a JSON object.
        """
        if unsupported:
            names = ", ".join(sorted(unsupported))
            if {"idempotent", "guard"} & set(unsupported):
                raise TypeError(
                    f"register_dynamic() does not accept {names}: dynamic tools cannot be "
                    "idempotent or guarded (the remote side validates its own arguments)"
                )
            raise TypeError(f"register_dynamic() got unexpected keyword arguments: {names}")
        item = DynamicTool(name, description=description, parameters=parameters, handler=handler)
        self.register(item)
        return item

    def _register_all(self, items: Iterable[Tool]) -> list[Tool]:
        # All or nothing: check every tool before adding any.
        pending: dict[str, Tool] = {}
        for item in items:
            self._admit(item, pending)
            pending[item.name] = item
        self._tools.update(pending)
        return list(pending.values())

    def register_module(self, module: types.ModuleType) -> list[Tool]:
        """Add every ``Tool`` bound to a name in ``module``, in definition order.

        The module's ``TOOLTRAIL_DEFAULTS`` apply to the tools defined in it. Method tools of
        classes are skipped (register an instance with ``register_toolkit``).

        Returns:
            The tools added.

        Raises:
            DuplicateToolError, RegistryFrozenError, ToolDefinitionError: as ``register``;
                nothing is added then.
        """
        found: dict[int, Tool] = {}
        for value in vars(module).values():
            if isinstance(value, Tool) and not (value.is_method and value._instance is None):
                found.setdefault(id(value), value)
        return self._register_all(found.values())

    def register_toolkit(self, toolkit: object) -> list[Tool]:
        """Add the ``@tool`` methods of ``toolkit``, bound to it, in definition order.

        Returns:
            The tools added.

        Raises:
            DuplicateToolError, RegistryFrozenError, ToolDefinitionError: as ``register``;
                nothing is added then.
        """
        names: dict[str, None] = {}
        for klass in reversed(type(toolkit).__mro__):
            for attr, value in vars(klass).items():
                if isinstance(value, Tool) and value.is_method:
                    names[attr] = None
        tools = [getattr(toolkit, attr) for attr in names]
        return self._register_all(item for item in tools if isinstance(item, Tool))

    def freeze(self) -> None:
        """Refuse further registrations (``build_worker`` calls this)."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        """Whether a worker was built on this registry."""
        return self._frozen

    def lookup(self, name: str) -> Tool | None:
        """Return the tool called exactly ``name``, or ``None``."""
        return self._tools.get(name)

    def resolve(self, name: str) -> Tool:
        """Return the tool called exactly ``name``.

        Raises:
            UnknownToolError: no tool has that name.
        """
        found = self._tools.get(name)
        if found is None:
            raise UnknownToolError(name)
        return found

    def __getitem__(self, name: str) -> Tool:
        return self.resolve(name)

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools[name] for name in self.names())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def tools(self) -> list[ToolSpec]:
        """Return the catalog, sorted by name."""
        return [item.spec() for item in self]

    def json_schemas(self) -> dict[str, dict[str, Any]]:
        """Return each tool's parameter schema by name."""
        return {spec.name: spec.parameters for spec in self.tools()}

    def openai_tools(self) -> list[dict[str, Any]]:
        """Return the catalog in OpenAI's ``tools`` format."""
        return [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in self.tools()
        ]

    def anthropic_tools(self) -> list[dict[str, Any]]:
        """Return the catalog in Anthropic's ``tools`` format."""
        return [
            {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
            for spec in self.tools()
        ]
