"""The module paths of release 0.x that moved in the layer move, kept for one release.

``import tooltrail.wire`` (or ``from tooltrail.wire import ...``) still works: a finder on
``sys.meta_path`` hands back the module at its new path, the very same module object (so
``monkeypatch`` and ``isinstance`` see one module), with a ``DeprecationWarning`` naming the
new path. The finder answers only for the names below, and only under ``tooltrail.``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "tooltrail.access": "tooltrail.tools.access",
    "tooltrail.approval_history": "tooltrail.ops.approval_history",
    "tooltrail.approver_keys": "tooltrail.ops.approver_keys",
    "tooltrail.body_lanes": "tooltrail.tools.body_lanes",
    "tooltrail.breaker": "tooltrail.core.breaker",
    "tooltrail.chain": "tooltrail.core.chain",
    "tooltrail.cli_config": "tooltrail.cli.config",
    "tooltrail.cli_options": "tooltrail.cli.options",
    "tooltrail.cli_runs": "tooltrail.cli.agent_runs",
    "tooltrail.codec": "tooltrail.runtime.codec",
    "tooltrail.codec_server": "tooltrail.ops.codec_server",
    "tooltrail.config": "tooltrail.core.config",
    "tooltrail.converter": "tooltrail.runtime.converter",
    "tooltrail.demo": "tooltrail.cli.demo",
    "tooltrail.detection": "tooltrail.core.detection",
    "tooltrail.dispatcher": "tooltrail.pipeline.dispatcher",
    "tooltrail.embedded": "tooltrail.runtime.embedded",
    "tooltrail.envelopes": "tooltrail.core.envelopes",
    "tooltrail.failures": "tooltrail.runtime.clean_failures",
    "tooltrail.forks": "tooltrail.ops.forks",
    "tooltrail.guards": "tooltrail.tools.guards",
    "tooltrail.heartbeats": "tooltrail.pipeline.heartbeats",
    "tooltrail.histories": "tooltrail.ops.histories",
    "tooltrail.hooks": "tooltrail.core.hooks",
    "tooltrail.host": "tooltrail.pipeline.host",
    "tooltrail.idempotency": "tooltrail.tools.idempotency",
    "tooltrail.mcp": "tooltrail.tools.mcp",
    "tooltrail.memoize": "tooltrail.core.memoize",
    "tooltrail.middleware": "tooltrail.pipeline.middleware",
    "tooltrail.observers": "tooltrail.pipeline.observers",
    "tooltrail.planner": "tooltrail.core.planner",
    "tooltrail.reconcile": "tooltrail.runtime.reconciler",
    "tooltrail.recovery": "tooltrail.core.recovery",
    "tooltrail.redaction": "tooltrail.pipeline.redaction",
    "tooltrail.registry_check": "tooltrail.pipeline.directory",
    "tooltrail.render": "tooltrail.cli.render",
    "tooltrail.replays": "tooltrail.ops.reruns",
    "tooltrail.results": "tooltrail.core.results",
    "tooltrail.runs": "tooltrail.core.branches",
    "tooltrail.scratch": "tooltrail.tools.scratch",
    "tooltrail.signatures": "tooltrail.core.signatures",
    "tooltrail.similarity": "tooltrail.core.similarity",
    "tooltrail.text": "tooltrail.core.text",
    "tooltrail.verify": "tooltrail.ops.verify",
    "tooltrail.versioning": "tooltrail.runtime.versioning",
    "tooltrail.wire": "tooltrail.core.wire",
}
"""Old module path -> new module path. ``tooltrail.worker`` is not here: that name is the
public function ``tooltrail.worker(host)`` (the module is ``tooltrail.runtime.worker``)."""


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.target}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path is already loaded."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,  # noqa: ARG002 - the finder protocol's signature
        target: ModuleType | None = None,  # noqa: ARG002
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
