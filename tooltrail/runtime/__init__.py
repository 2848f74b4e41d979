"""The worker process.

``build_worker``, the embedded Temporal server, the payload codec and
data converter, deployment versioning, background reconciliation and the activity
interceptor that keeps database data out of failures.

May import: everything below it (ground, ``core``, ``tools``, ``llm``, ``db``,
``pipeline``) and the ``workflows`` and ``activities`` packages it registers.
"""
