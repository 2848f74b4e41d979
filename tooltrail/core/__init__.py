"""Pure, workflow-safe logic: the values that cross Temporal and the rules that act on them.

Owns the results and the wire models, the per-turn configuration, the planner, loop
detection, the recovery rules, the breaker's state machine, the memoization cache, the hook
decisions, the model messages, the exact model-visible texts, the hash chain and the signed
approval statement.

May import: ``tooltrail.errors``, pydantic, and ``temporalio``'s pure data types (retry
policies, exceptions). No I/O, no clock, no randomness, no module state: the workflow
sandbox passes this whole package through (``tooltrail.runtime.worker.PURE_MODULES``), and
``tests/test_layers.py`` checks that importing it loads no SQLAlchemy, httpx, MCP or
OpenTelemetry SDK.
"""
