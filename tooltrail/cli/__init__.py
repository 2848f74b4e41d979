"""The ``tooltrail`` command line: one module per command group.

``_app`` builds the Typer application and the turn, worker, audit, approval, history and
database commands; ``agent_runs`` the agent-run commands; ``config`` the settings view;
``options`` and ``_shared`` what the modules share; ``render`` the terminal views; ``demo`` the
demo's tools and scripted turn. ``python -m tooltrail.cli`` runs ``main``.

May import: every layer below it (ground, ``core``, ``tools``, ``llm``, ``db``,
``pipeline``, ``runtime``, ``ops``, ``client``). Nothing imports the command line.
"""

from tooltrail.cli._app import EXIT_ERROR, EXIT_FOUND, app, load_host, main

__all__ = ["EXIT_ERROR", "EXIT_FOUND", "app", "load_host", "main"]
