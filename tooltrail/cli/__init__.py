"""The ``tooltrail`` command line: one module per command group.

``_app`` holds ``main`` and mounts the command groups; ``serve`` runs things (``demo``,
``run``, ``dev``, ``worker``, ``codec-server``); ``audit`` reads and checks the trail;
``approvals`` answers and lists approvals; ``histories`` exports and replays histories;
``reruns`` reruns a turn; ``database`` migrates the database; ``agent_runs`` the agent-run
commands; ``config`` the settings view; ``options`` and ``_shared`` what the modules share (the
Typer app and groups among it); ``render`` the terminal views; ``demo`` the demo's tools and
scripted turn. ``python -m tooltrail.cli`` runs ``main``.

May import: every layer below it (ground, ``core``, ``tools``, ``llm``, ``db``,
``pipeline``, ``runtime``, ``ops``, ``client``). Nothing imports the command line.
"""

from tooltrail.cli._app import main
from tooltrail.cli._shared import EXIT_ERROR, EXIT_FOUND, app, load_host

__all__ = ["EXIT_ERROR", "EXIT_FOUND", "app", "load_host", "main"]
