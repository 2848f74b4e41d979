"""Workflows: deterministic code only; checked by replay tests over ``tests/histories/``.

The package imports none of its modules: Temporal's sandbox re-imports a workflow's module
(and its package) for every run, so each run pays only for the workflow it runs. Import
``workflows.turn``, ``workflows.agent`` and ``workflows.session`` directly.

May import: only ``tooltrail.core`` and ``tooltrail.errors`` (what the sandbox passes through).
"""
