"""Settings from the environment (``TOOLTRAIL_*``) and an optional ``.env`` file.

Precedence, highest first: values passed to ``Settings(...)``, ``TOOLTRAIL_*`` environment
variables, the ``.env`` file of the working directory, the defaults below.

Secrets (API keys, codec keys) are ``SecretStr``: their ``repr`` and ``str`` show ``**********``,
and a validation error never echoes an input (``hide_input_in_errors``), so a malformed key
cannot end up in a log or a terminal. ``Settings.masked()`` is the one view to print.

The standard ``OTEL_*`` variables are not fields here: the OpenTelemetry SDK reads them itself
(see ``tooltrail.telemetry.configure_from_env``); ``otel_enabled`` only switches it on.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tooltrail.errors import ConfigurationError

if typing.TYPE_CHECKING:
    from tooltrail.core.pricing import ModelPrice

__all__ = [
    "CODEC_KEY_BYTES",
    "MASK",
    "UNSET",
    "LogLevel",
    "McpServerSpec",
    "Settings",
    "default_data_dir",
]

MASK = "****"
"""How ``Settings.masked()`` shows a secret that is set (and a URL's password)."""
UNSET = "(unset)"
"""How ``Settings.masked()`` shows a secret that is not set."""
CODEC_KEY_BYTES = 32
"""Size of a payload codec key: AES-256-GCM (``tooltrail.runtime.codec``)."""

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
"""A standard ``logging`` level name."""

# Query parameters of a URL whose values are credentials (``?password=...``, ``?api_key=...``).
_SECRET_QUERY_KEY = re.compile(r"(?i)pass(word)?|secret|token|api[_-]?key|sslpassword")


def default_data_dir() -> Path:
    """Return where the embedded stack keeps its files (``$XDG_DATA_HOME/tooltrail``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tooltrail"


def _split_url_password(url: str) -> tuple[str, str | None, str]:
    """Split ``url`` around the password of its authority: ``(before, password, after)``.

    Done by hand rather than with ``urllib.parse``: database URLs are not always valid
    RFC 3986 (``postgresql+asyncpg://``, unescaped ``@`` or ``:`` in passwords), and a parser
    that rejects them would print nothing masked at all.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None, ""
    end = len(rest)
    for delimiter in "/?#":
        found = rest.find(delimiter)
        if found != -1:
            end = min(end, found)
    # The last '@' of the authority ends the userinfo; a password may contain '@' itself.
    authority = rest[:end]
    at = authority.rfind("@")
    if at == -1:
        return url, None, ""
    user, colon, password = authority[:at].partition(":")
    if not colon:
        return url, None, ""
    return f"{scheme}://{user}:", password, rest[at:]


def mask_url(url: str) -> str:
    """Return ``url`` with its password, and credential query values, replaced by ``****``."""
    before, password, after = _split_url_password(url)
    masked = url if password is None else f"{before}{MASK}{after}"
    head, question, query = masked.partition("?")
    if not question:
        return masked
    pairs = []
    for pair in query.split("&"):
        key, equals, value = pair.partition("=")
        pairs.append(
            f"{key}={MASK}" if equals and value and _SECRET_QUERY_KEY.search(key) else pair
        )
    return f"{head}?{'&'.join(pairs)}"


def url_password(url: str | None) -> str | None:
    """Return the password in ``url``'s authority, if any."""
    if not url:
        return None
    return _split_url_password(url)[1] or None


def parse_codec_keys(text: str) -> dict[str, bytes]:
    """Parse ``kid1:base64key,kid2:base64key`` into an ordered ``{kid: key}`` mapping.

    Error messages name key ids and positions, never key material.

    Raises:
        ValueError: an entry is malformed, an id repeats, or a key is not 32 bytes.
    """
    keys: dict[str, bytes] = {}
    for position, entry in enumerate((e.strip() for e in text.split(",")), start=1):
        if not entry:
            continue
        kid, colon, encoded = entry.partition(":")
        kid = kid.strip()
        if not colon or not kid or not encoded.strip():
            raise ValueError(
                f"codec key #{position} is not 'KEY_ID:BASE64_KEY'; "
                "TOOLTRAIL_CODEC_KEYS is 'kid1:base64key,kid2:base64key'"
            )
        if kid in keys:
            raise ValueError(f"codec key id {kid!r} appears twice in TOOLTRAIL_CODEC_KEYS")
        # Standard or URL-safe base64, as ``tooltrail.runtime.codec`` accepts.
        alphabet = encoded.strip().replace("-", "+").replace("_", "/")
        try:
            key = base64.b64decode(alphabet, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"codec key {kid!r} is not valid base64") from None
        if len(key) != CODEC_KEY_BYTES:
            raise ValueError(
                f"codec key {kid!r} decodes to {len(key)} bytes; "
                f"AES-256-GCM needs exactly {CODEC_KEY_BYTES}"
            )
        keys[kid] = key
    if not keys:
        raise ValueError("TOOLTRAIL_CODEC_KEYS is set but holds no key")
    return keys


_MCP_PREFIX = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True)
class McpServerSpec:
    """One MCP server of a worker: ``PREFIX=COMMAND ARGS`` or ``PREFIX=URL``.

    Its tools are registered as ``PREFIX_name`` (no ``_`` is added when the prefix is empty
    or already ends with ``_`` or ``-``).
    """

    prefix: str
    command: tuple[str, ...] = ()
    """A stdio server: the program and its arguments."""
    url: str | None = None
    """Or a streamable HTTP server."""

    @classmethod
    def parse(cls, text: str, *, url: bool | None = None) -> McpServerSpec:
        """Parse ``PREFIX=COMMAND ARGS`` (shell-quoted) or ``PREFIX=URL``.

        Args:
            text: the specification.
            url: ``True`` for a URL, ``False`` for a command, ``None`` to tell by the value
                (``http://`` or ``https://`` is a URL).

        Raises:
            ConfigurationError: no ``=``, a prefix outside ``[A-Za-z0-9_-]``, or nothing
                after the ``=``.
        """
        prefix, equals, value = text.partition("=")
        value = value.strip()
        prefix = prefix.strip()
        if not equals or not value or not _MCP_PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"MCP server {text!r} must look like PREFIX=COMMAND ARGS or PREFIX=URL "
                "(PREFIX: letters, digits, '_' and '-'; it may be empty)"
            )
        if url is None:
            url = value.startswith(("http://", "https://"))
        if url:
            return cls(prefix=prefix, url=value)
        try:
            command = tuple(shlex.split(value))
        except ValueError as exc:
            raise ConfigurationError(f"MCP server {text!r}: {exc}") from None
        return cls(prefix=prefix, command=command)

    @property
    def tool_prefix(self) -> str:
        """What goes before each tool's name."""
        if not self.prefix or self.prefix.endswith(("_", "-")):
            return self.prefix
        return f"{self.prefix}_"


class Settings(BaseSettings):
    """tooltrail's settings; every field reads ``TOOLTRAIL_<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLTRAIL_",
        env_file=".env",
        extra="ignore",
        # A rejected value may be a secret (a malformed key, a URL with a password).
        hide_input_in_errors=True,
    )

    temporal_address: str = "localhost:7233"
    """Temporal frontend address of an existing cluster."""
    namespace: str = "default"
    """Temporal namespace."""
    task_queue: str = "tooltrail"
    """Task queue of the turn workflows and tool activities."""
    database_url: str | None = None
    """Audit database URL; ``None`` means the embedded SQLite file under ``data_dir``."""
    sqlite_shared: bool = False
    """Let several worker processes share one SQLite file (refused by default: SQLite is the
    one-process default; PostgreSQL is the database for several workers)."""
    data_dir: Path = Field(default_factory=default_data_dir)
    """Directory of the embedded SQLite file and the embedded server's state."""
    embedded_startup_timeout_s: float = Field(default=60.0, gt=0)
    """How long the embedded Temporal dev server may take to start (``tooltrail.local``,
    ``demo``, ``dev``, ``run``); it starts in about a second on an idle machine."""

    # -- Temporal connection security ------------------------------------------------------
    temporal_tls: bool = False
    """Connect to Temporal over TLS (implied by any TLS setting below, or an API key)."""
    temporal_tls_client_cert: Path | None = None
    """PEM client certificate for mutual TLS."""
    temporal_tls_client_key: Path | None = None
    """PEM private key of ``temporal_tls_client_cert``."""
    temporal_tls_server_ca: Path | None = None
    """PEM CA bundle that signs the server's certificate (default: the system roots)."""
    temporal_tls_server_name: str | None = None
    """Server name to verify the certificate against (default: the address's host)."""
    temporal_api_key: SecretStr | None = None
    """API key for Temporal Cloud (sent as a bearer token; requires TLS)."""

    # -- payload codec ---------------------------------------------------------------------
    codec_keys: SecretStr | None = None
    """AES-GCM payload keys, ``kid1:base64key,kid2:base64key``; the first encrypts.

    Older keys stay listed so payloads written with them still decrypt (key rotation)."""
    codec_key_id: str | None = None
    """Id of the key that encrypts new payloads (default: the first of ``codec_keys``)."""
    codec_server_token: SecretStr | None = None
    """The bearer token ``tooltrail codec-server`` requires (at least 16 characters)."""
    codec_server_origins: str = "http://localhost:8233,http://127.0.0.1:8233"
    """Browser origins (the Temporal UI's) allowed to call the codec server, comma-separated;
    the default is ``tooltrail dev``'s UI."""
    codec_server_tls_cert: Path | None = None
    """PEM certificate the codec server serves HTTPS with (with ``codec_server_tls_key``)."""
    codec_server_tls_key: Path | None = None
    """PEM private key of ``codec_server_tls_cert``."""
    codec_server_max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    """The largest request body the codec server's ``/encode`` and ``/decode`` read (64 MiB:
    a history page of payloads of up to 2 MiB each); a larger one is answered 413."""

    # -- signed approvals ------------------------------------------------------------------
    approvers: str | None = None
    """Approvers whose signed approvals a worker's turns accept: ``name:base64key`` entries
    (the raw Ed25519 public key), comma-separated. With none here, in ``approvers_file`` or
    in the host wiring, approvals are unsigned and their ``by`` is only a claim."""
    approvers_file: Path | None = None
    """A file of approvers, one ``name:base64key`` a line (``#`` comments), read by workers."""
    approver_key: Path | None = None
    """The PEM private key ``tooltrail approve``/``deny`` sign with (``--key``)."""
    approver_name: str | None = None
    """The approver name ``tooltrail approve``/``deny`` sign as (``--by``)."""
    worker_key: SecretStr | None = None
    """The workers' shared HMAC keys, ``kid1:base64key,kid2:base64key`` (32 bytes or more
    each); the first makes proofs, all check them (``tooltrail.core.proofs``). A worker proves
    the approvals it takes up to the worker that runs the call with it; without one it refuses
    approvals. The embedded stack (``tooltrail.local``) makes its own."""
    worker_key_file: Path | None = None
    """A file holding ``worker_key``'s value (read when ``worker_key`` is unset)."""

    # -- model endpoints -------------------------------------------------------------------
    openai_base_url: str = "https://api.openai.com/v1"
    """Base URL of an OpenAI-compatible chat completions API."""
    openai_api_key: SecretStr | None = None
    """API key of ``openai_base_url``."""
    anthropic_base_url: str = "https://api.anthropic.com"
    """Base URL of the Anthropic Messages API."""
    anthropic_api_key: SecretStr | None = None
    """API key of ``anthropic_base_url``."""
    model: str | None = None
    """Default model name for agent loops that do not pick one."""
    model_prices: str | None = None
    """The price table of the models, for the estimated cost of each model call in the audit
    trail: a JSON object ``{"MODEL": {"input": N, "output": N, "cached_input": N,
    "cache_write": N}}`` in USD per million tokens (the last two optional; see
    ``tooltrail.core.pricing``). Never looked up on the network; a model missing from it has
    no cost."""

    # -- observability ---------------------------------------------------------------------
    otel_enabled: bool = False
    """Set up OpenTelemetry traces and metrics (configured by the standard ``OTEL_*``
    variables, which the SDK reads itself)."""
    log_format: Literal["text", "json"] = "text"
    """``text`` for people, ``json`` (one object a line) for log pipelines."""
    log_level: LogLevel = "INFO"
    """Root log level (case-insensitive)."""

    # -- MCP servers of a worker -----------------------------------------------------------
    mcp_servers: list[str] = Field(default_factory=list)
    """MCP servers a worker registers at start, each ``PREFIX=COMMAND ARGS`` or
    ``PREFIX=URL`` (a JSON list in ``TOOLTRAIL_MCP_SERVERS``); clients that see it set learn
    the tool names from a worker (``tooltrail.connect``)."""

    # -- capacity (docs/operations/sizing.md): what one worker takes on, and its database pool --
    max_concurrent_activities: int = Field(default=100, ge=1)
    """Tool attempts (and other activities) one worker runs at once."""
    max_concurrent_workflow_tasks: int = Field(default=100, ge=2)
    """Workflow tasks one worker processes at once (at least 2, for the workflow cache)."""
    max_concurrent_local_activities: int = Field(default=100, ge=1)
    """Local activities (audit writes, ``@tool(local=True)`` attempts) one worker runs at once."""
    max_cached_workflows: int = Field(default=1000, ge=0)
    """Workflows kept in a worker's memory between their tasks (0: no cache, every task
    replays the whole history)."""
    db_pool_size: int = Field(default=5, ge=1)
    """Database connections each process keeps open (per engine)."""
    db_max_overflow: int = Field(default=10, ge=0)
    """Connections a process may open beyond ``db_pool_size`` under load."""
    db_pool_timeout_s: float = Field(default=30.0, gt=0)
    """How long a database call waits for a free connection before it fails."""

    # -- safe deploys (docs/operations/upgrading.md): worker deployment versioning ----------
    worker_deployment: str | None = None
    """The worker deployment a worker polls as (with ``worker_build_id``); ``None``:
    unversioned (all workers of the queue must then run compatible code)."""
    worker_build_id: str | None = None
    """This worker's build id in ``worker_deployment``: a new one for each release."""

    # -- background reconciliation (docs/operations/audit-trail.md) ----------------------------
    reconcile_enabled: bool = True
    """Workers reconcile turns closed outside tooltrail in the background (one at a time)."""
    reconcile_interval_s: float = Field(default=60.0, gt=0)
    """Seconds between two background passes."""
    reconcile_grace_s: float = Field(default=300.0, ge=0)
    """A running turn is asked about once it started this long ago, then at most this often."""
    reconcile_batch: int = Field(default=100, ge=1)
    """Turns one background pass asks Temporal about at most (one describe each), and closed
    turns with no row it rebuilds from their histories at most."""
    reconcile_settle_s: float = Field(default=30.0, ge=0)
    """A turn closed with no row is rebuilt once it closed this long ago (a write a worker
    had in flight as Temporal ended the turn lands first)."""

    def worker_options(self) -> dict[str, int]:
        """Return the capacity keyword arguments of ``temporalio.worker.Worker``."""
        return {
            "max_concurrent_activities": self.max_concurrent_activities,
            "max_concurrent_workflow_tasks": self.max_concurrent_workflow_tasks,
            "max_concurrent_local_activities": self.max_concurrent_local_activities,
            "max_cached_workflows": self.max_cached_workflows,
        }

    def pool_options(self) -> dict[str, Any]:
        """Return the connection pool keyword arguments of a SQLAlchemy engine."""
        return {
            "pool_size": self.db_pool_size,
            "max_overflow": self.db_max_overflow,
            "pool_timeout": self.db_pool_timeout_s,
        }

    @field_validator(
        "temporal_api_key",
        "codec_keys",
        "codec_server_token",
        "worker_key",
        "openai_api_key",
        "anthropic_api_key",
    )
    @classmethod
    def _empty_secret_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        # ``TOOLTRAIL_OPENAI_API_KEY=`` in a .env template means "not set", not "empty key".
        if value is not None and not value.get_secret_value().strip():
            return None
        return value

    @field_validator("codec_keys")
    @classmethod
    def _codec_keys_parse(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parse_codec_keys(value.get_secret_value())
        return value

    @field_validator("worker_key")
    @classmethod
    def _worker_key_parse(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            from tooltrail.core.proofs import parse_worker_keys

            parse_worker_keys(value.get_secret_value())
        return value

    @field_validator("codec_key_id")
    @classmethod
    def _codec_key_id_is_listed(cls, value: str | None, info: ValidationInfo) -> str | None:
        keys: SecretStr | None = info.data.get("codec_keys")
        if value is None:
            return None
        if keys is None:
            raise ValueError("TOOLTRAIL_CODEC_KEY_ID is set but TOOLTRAIL_CODEC_KEYS is not")
        known = list(parse_codec_keys(keys.get_secret_value()))
        if value not in known:
            raise ValueError(f"codec key id {value!r} is not one of TOOLTRAIL_CODEC_KEYS {known}")
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_servers_parse(cls, value: list[str]) -> list[str]:
        for position, entry in enumerate(value, start=1):
            try:
                McpServerSpec.parse(entry)
            except ConfigurationError:
                # Not the entry itself: a command line or URL may carry a token.
                raise ValueError(
                    f"TOOLTRAIL_MCP_SERVERS entry #{position} is not PREFIX=COMMAND ARGS or "
                    "PREFIX=URL"
                ) from None
        return value

    @field_validator("model_prices")
    @classmethod
    def _model_prices_parse(cls, value: str | None) -> str | None:
        from tooltrail.core.pricing import parse_prices

        parse_prices(value)
        return value

    def model_price_table(self) -> dict[str, ModelPrice]:
        """Return the parsed ``model_prices`` (empty when unset)."""
        from tooltrail.core.pricing import parse_prices

        return parse_prices(self.model_prices)

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level_upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    def effective_database_url(self) -> str:
        """Return ``database_url``, or the embedded SQLite file's URL."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'tooltrail.db'}"

    def approver_keys(self) -> dict[str, str]:
        """The configured approvers, name to base64 public key (``approvers`` and the file).

        Raises:
            ConfigurationError: a malformed entry, an unreadable file, or a name given twice.
        """
        from tooltrail.core.signatures import parse_approvers
        from tooltrail.errors import ConfigurationError

        texts = [("TOOLTRAIL_APPROVERS", self.approvers or "")]
        if self.approvers_file is not None:
            try:
                texts.append((str(self.approvers_file), self.approvers_file.read_text("utf-8")))
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(
                    f"cannot read the approvers file {self.approvers_file}: {exc}"
                ) from None
        found: dict[str, str] = {}
        for source, text in texts:
            try:
                parsed = parse_approvers(text)
            except ValueError as exc:
                raise ConfigurationError(f"{source}: {exc}") from None
            for name in parsed.keys() & found.keys():
                raise ConfigurationError(f"approver {name!r} is configured twice")
            found.update(parsed)
        return found

    def worker_key_ring(self) -> dict[str, bytes]:
        """The worker keys by id, the one that makes proofs first; empty when none is set.

        Raises:
            ConfigurationError: a malformed key, or an unreadable key file.
        """
        from tooltrail.core.proofs import parse_worker_keys

        source, text = "TOOLTRAIL_WORKER_KEY", ""
        if self.worker_key is not None:
            text = self.worker_key.get_secret_value()
        elif self.worker_key_file is not None:
            source = str(self.worker_key_file)
            try:
                text = self.worker_key_file.read_text("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(
                    f"cannot read the worker key file {source}: {exc}"
                ) from None
        try:
            return parse_worker_keys(text)
        except ValueError as exc:
            raise ConfigurationError(f"{source}: {exc}") from None

    def codec_key_ring(self) -> dict[str, bytes]:
        """Return the codec keys by id, the active one first; empty without ``codec_keys``.

        ``AesGcmCodec(settings.codec_key_ring(), settings.active_codec_key_id())`` builds the
        payload codec, honouring ``codec_key_id``.
        """
        if self.codec_keys is None:
            return {}
        keys = parse_codec_keys(self.codec_keys.get_secret_value())
        active = self.active_codec_key_id()
        if active is None:
            return keys
        return {active: keys[active], **{kid: k for kid, k in keys.items() if kid != active}}

    def active_codec_key_id(self) -> str | None:
        """Return the id of the key new payloads are encrypted with, or ``None``."""
        if self.codec_keys is None:
            return None
        return self.codec_key_id or next(iter(parse_codec_keys(self.codec_keys.get_secret_value())))

    def codec_server_origin_list(self) -> list[str]:
        """Return ``codec_server_origins`` as a list (spaces and empty entries dropped)."""
        return [origin.strip() for origin in self.codec_server_origins.split(",") if origin.strip()]

    def temporal_uses_tls(self) -> bool:
        """Whether the Temporal connection must use TLS (asked for, or implied)."""
        return bool(
            self.temporal_tls
            or self.temporal_tls_client_cert
            or self.temporal_tls_client_key
            or self.temporal_tls_server_ca
            or self.temporal_tls_server_name
            or self.temporal_api_key
        )

    def temporal_connect_options(self) -> dict[str, Any]:
        """Return the TLS and API-key keyword arguments for ``Client.connect``.

        ``connect_client(address, namespace=..., **settings.temporal_connect_options())``.
        Empty when neither TLS nor an API key is configured; ``tls=True`` (system roots, no
        client certificate) when TLS is asked for without files.

        Raises:
            ConfigurationError: a client certificate without its key (or the reverse), or a
                file that cannot be read.
        """
        options: dict[str, Any] = {}
        if self.temporal_api_key is not None:
            options["api_key"] = self.temporal_api_key.get_secret_value()
        if not self.temporal_uses_tls():
            return options
        if (self.temporal_tls_client_cert is None) != (self.temporal_tls_client_key is None):
            raise ConfigurationError(
                "mutual TLS needs both TOOLTRAIL_TEMPORAL_TLS_CLIENT_CERT and "
                "TOOLTRAIL_TEMPORAL_TLS_CLIENT_KEY"
            )
        files = (
            self.temporal_tls_server_ca,
            self.temporal_tls_client_cert,
            self.temporal_tls_client_key,
        )
        if not any(files) and self.temporal_tls_server_name is None:
            options["tls"] = True
            return options
        # Imported here: settings are read by every command, most of which never connect.
        from temporalio.service import TLSConfig

        ca, cert, key = (_read_pem(path) for path in files)
        options["tls"] = TLSConfig(
            server_root_ca_cert=ca,
            client_cert=cert,
            client_private_key=key,
            domain=self.temporal_tls_server_name,
        )
        return options

    def secret_values(self) -> list[str]:
        """Return every secret's plain text, for redaction (``tooltrail.logs``).

        Codec keys are listed one by one as well as whole, since a single base64 key is what
        would leak in practice; the database and endpoint URLs' passwords are included.
        """
        values: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                values.append(value.get_secret_value())
        if self.codec_keys is not None:
            for entry in self.codec_keys.get_secret_value().split(","):
                values.append(entry.partition(":")[2].strip())
        for url in (self.database_url, self.openai_base_url, self.anthropic_base_url):
            password = url_password(url)
            if password:
                values.append(password)
        return [value for value in values if value]

    def masked(self) -> dict[str, Any]:
        """Return the settings as JSON-ready values, safe to print or log.

        Secrets show as ``"****"`` (set) or ``"(unset)"``; URLs keep everything but their
        password. ``effective_database_url`` is added: the database actually used.
        """
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            annotation = type(self).model_fields[name].annotation
            if isinstance(value, SecretStr):
                out[name] = MASK
            elif value is None and _is_secret_annotation(annotation):
                out[name] = UNSET
            elif isinstance(value, str) and name.endswith("_url"):
                out[name] = mask_url(value)
            elif name == "mcp_servers":
                out[name] = [mask_url(entry) for entry in value]
            elif isinstance(value, Path):
                out[name] = str(value)
            else:
                out[name] = value
        out["effective_database_url"] = mask_url(self.effective_database_url())
        return out


def _read_pem(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read TLS file {str(path)!r}: {exc.strerror}") from exc


def _is_secret_annotation(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)
