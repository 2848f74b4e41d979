"""After the fact.

Verifying a trail against Temporal, reruns and shadow runs, history export
and replay, forks, a turn's approval history, approvers' keys and the codec server.

May import: everything below it (ground, ``core``, ``tools``, ``llm``, ``db``, ``pipeline``,
``runtime``, ``workflows``). Imported by ``tooltrail.client`` and ``tooltrail.cli``.
"""
