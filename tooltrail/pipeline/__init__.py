"""One tool attempt, worker side.

The host wiring, the dispatcher, the middleware, the
observers, the attempt's heartbeats, redaction and the registry directory.

May import: the ground modules (``tooltrail.errors``, ``settings``, ``telemetry``, ``logs``),
``tooltrail.core``, ``tooltrail.tools``, ``tooltrail.llm`` and ``tooltrail.db``.
"""
