"""``python -m tooltrail.cli``: the command line."""

from tooltrail.cli._app import main

main()
