"""Settings: precedence, secrets, codec keys, masking, and ``tooltrail config show``."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from temporalio.service import TLSConfig
from typer.testing import CliRunner, Result

from tooltrail.cli.config import config_app
from tooltrail.errors import ConfigurationError
from tooltrail.settings import MASK, UNSET, Settings, mask_url

OPENAI_KEY = "sk-openai-3e1f0c9b8a7d"
ANTHROPIC_KEY = "sk-ant-5d4c3b2a1f0e"
TEMPORAL_KEY = "tmprl-9f8e7d6c5b4a"
DB_PASSWORD = "db-pa55-w0rd"
KEY_A = base64.b64encode(b"A" * 32).decode()
KEY_B = base64.urlsafe_b64encode(b"\xfb" * 32).decode()  # URL-safe alphabet


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No TOOLTRAIL_* variables, an empty working directory (no .env), a private data dir."""
    for name in list(os.environ):
        if name.upper().startswith("TOOLTRAIL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def write_dotenv(directory: Path, **values: str) -> None:
    text = "".join(f"TOOLTRAIL_{name.upper()}={value}\n" for name, value in values.items())
    (directory / ".env").write_text(text)


# -- defaults and precedence -----------------------------------------------------------------


def test_existing_defaults_are_unchanged(clean_env: Path, tmp_path: Path) -> None:
    settings = Settings()
    assert settings.temporal_address == "localhost:7233"
    assert settings.namespace == "default"
    assert settings.task_queue == "tooltrail"
    assert settings.database_url is None
    assert settings.data_dir == tmp_path / "xdg" / "tooltrail"
    assert settings.effective_database_url() == (
        f"sqlite:///{tmp_path / 'xdg' / 'tooltrail' / 'tooltrail.db'}"
    )
    assert Settings(database_url="postgresql://x/y").effective_database_url() == "postgresql://x/y"


def test_new_fields_default_to_off_and_unset(clean_env: Path) -> None:
    settings = Settings()
    assert settings.temporal_tls is False and not settings.temporal_uses_tls()
    assert settings.temporal_api_key is None
    assert settings.codec_keys is None and settings.codec_key_ring() == {}
    assert settings.active_codec_key_id() is None
    assert settings.openai_api_key is None and settings.anthropic_api_key is None
    assert settings.openai_base_url == "https://api.openai.com/v1"
    assert settings.anthropic_base_url == "https://api.anthropic.com"
    assert settings.model is None
    assert settings.otel_enabled is False
    assert (settings.log_format, settings.log_level) == ("text", "INFO")
    assert settings.secret_values() == []


def test_precedence_init_over_env_over_dotenv_over_default(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dotenv(
        clean_env,
        task_queue="dotenv-queue",
        namespace="dotenv-ns",
        model="dotenv-model",
        openai_api_key="sk-from-dotenv",
    )
    monkeypatch.setenv("TOOLTRAIL_TASK_QUEUE", "env-queue")
    monkeypatch.setenv("TOOLTRAIL_NAMESPACE", "env-ns")
    settings = Settings(task_queue="init-queue")
    assert settings.task_queue == "init-queue"  # explicit > env > .env
    assert settings.namespace == "env-ns"  # env > .env
    assert settings.model == "dotenv-model"  # .env > default
    assert settings.temporal_address == "localhost:7233"  # default
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-from-dotenv"


def test_env_names_are_case_insensitive_and_typed(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("tooltrail_temporal_tls", "true")
    monkeypatch.setenv("TOOLTRAIL_TEMPORAL_TLS_CLIENT_CERT", "/etc/tls/client.pem")
    monkeypatch.setenv("TOOLTRAIL_OTEL_ENABLED", "1")
    monkeypatch.setenv("TOOLTRAIL_LOG_LEVEL", "debug")
    monkeypatch.setenv("TOOLTRAIL_LOG_FORMAT", "json")
    settings = Settings()
    assert settings.temporal_tls is True and settings.temporal_uses_tls()
    assert settings.temporal_tls_client_cert == Path("/etc/tls/client.pem")
    assert settings.otel_enabled is True
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")


def test_an_api_key_implies_tls(clean_env: Path) -> None:
    assert Settings(temporal_api_key=TEMPORAL_KEY).temporal_uses_tls()


def test_temporal_connect_options(clean_env: Path, tmp_path: Path) -> None:
    assert Settings().temporal_connect_options() == {}
    assert Settings(temporal_tls=True).temporal_connect_options() == {"tls": True}
    assert Settings(temporal_api_key=TEMPORAL_KEY).temporal_connect_options() == {
        "api_key": TEMPORAL_KEY,
        "tls": True,
    }
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_bytes(f"pem of {name}".encode())
    options = Settings(
        temporal_tls_server_ca=tmp_path / "ca.pem",
        temporal_tls_client_cert=tmp_path / "client.pem",
        temporal_tls_client_key=tmp_path / "client.key",
        temporal_tls_server_name="temporal.internal",
    ).temporal_connect_options()
    tls = options["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == b"pem of ca.pem"
    assert (tls.client_cert, tls.client_private_key) == (b"pem of client.pem", b"pem of client.key")
    assert tls.domain == "temporal.internal"
    with pytest.raises(ConfigurationError, match="needs both"):
        Settings(temporal_tls_client_cert=tmp_path / "client.pem").temporal_connect_options()
    with pytest.raises(ConfigurationError, match="cannot read TLS file"):
        Settings(temporal_tls_server_ca=tmp_path / "nope.pem").temporal_connect_options()


def test_invalid_enumerations_are_rejected(clean_env: Path) -> None:
    with pytest.raises(ValidationError, match="log_format"):
        Settings(log_format="xml")
    with pytest.raises(ValidationError, match="log_level"):
        Settings(log_level="loud")


# -- secrets -----------------------------------------------------------------------------------


def test_secrets_are_secretstr_and_never_in_repr(clean_env: Path) -> None:
    settings = Settings(openai_api_key=OPENAI_KEY, anthropic_api_key=ANTHROPIC_KEY)
    assert isinstance(settings.openai_api_key, SecretStr)
    assert OPENAI_KEY not in repr(settings) and OPENAI_KEY not in str(settings)
    assert ANTHROPIC_KEY not in repr(settings)


def test_an_empty_secret_means_unset(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLTRAIL_OPENAI_API_KEY", "")
    write_dotenv(clean_env, anthropic_api_key="  ")
    settings = Settings()
    assert settings.openai_api_key is None and settings.anthropic_api_key is None


def test_masked_hides_every_secret_and_the_database_password(clean_env: Path) -> None:
    settings = Settings(
        openai_api_key=OPENAI_KEY,
        temporal_api_key=TEMPORAL_KEY,
        codec_keys=f"a:{KEY_A},b:{KEY_B}",
        database_url=f"postgresql+asyncpg://app:{DB_PASSWORD}@db:5432/audit",
        data_dir=Path("/srv/tooltrail"),
    )
    masked = settings.masked()
    assert masked["openai_api_key"] == MASK
    assert masked["temporal_api_key"] == MASK
    assert masked["codec_keys"] == MASK
    assert masked["anthropic_api_key"] == UNSET
    assert masked["database_url"] == "postgresql+asyncpg://app:****@db:5432/audit"
    assert masked["effective_database_url"] == masked["database_url"]
    assert masked["data_dir"] == "/srv/tooltrail"
    assert masked["task_queue"] == "tooltrail"
    text = json.dumps(masked)
    for secret in (OPENAI_KEY, TEMPORAL_KEY, KEY_A, KEY_B, DB_PASSWORD):
        assert secret not in text
    assert set(settings.secret_values()) >= {OPENAI_KEY, TEMPORAL_KEY, KEY_A, KEY_B, DB_PASSWORD}


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("sqlite:////tmp/a.db", "sqlite:////tmp/a.db"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
        ("postgresql://app:p@ss:w@db/x", "postgresql://app:****@db/x"),
        ("postgresql://db/x?user=a&password=s3cret", "postgresql://db/x?user=a&password=****"),
        ("https://user:tok@proxy.example/v1", "https://user:****@proxy.example/v1"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


# -- codec keys --------------------------------------------------------------------------------


def test_codec_keys_first_is_active_unless_a_key_id_is_given(clean_env: Path) -> None:
    settings = Settings(codec_keys=f"old:{KEY_B}, new:{KEY_A}")
    assert settings.active_codec_key_id() == "old"
    assert settings.codec_key_ring() == {"old": b"\xfb" * 32, "new": b"A" * 32}
    rotated = Settings(codec_keys=f"old:{KEY_B},new:{KEY_A}", codec_key_id="new")
    assert rotated.active_codec_key_id() == "new"
    assert list(rotated.codec_key_ring()) == ["new", "old"]


@pytest.mark.parametrize(
    ("keys", "key_id", "message"),
    [
        ("nokey", None, "codec key #1 is not 'KEY_ID:BASE64_KEY'"),
        (f"a:{KEY_A},a:{KEY_B}", None, "'a' appears twice"),
        ("a:!!notbase64!!", None, "codec key 'a' is not valid base64"),
        (
            f"a:{base64.b64encode(b'short').decode()}",
            None,
            "decodes to 5 bytes; AES-256-GCM needs exactly 32",
        ),
        (f"a:{KEY_A}", "zz", "'zz' is not one of"),
        (None, "a", "CODEC_KEY_ID is set but TOOLTRAIL_CODEC_KEYS is not"),
    ],
)
def test_bad_codec_keys_are_rejected_without_echoing_them(
    clean_env: Path, keys: str | None, key_id: str | None, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        Settings(codec_keys=keys, codec_key_id=key_id)
    if keys is not None:
        for entry in keys.split(","):
            material = entry.partition(":")[2]
            if material:
                assert material not in str(caught.value)


# -- tooltrail config show ---------------------------------------------------------------------


def run_show(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(config_app, ["show", *args], env={"COLUMNS": "200", **(env or {})})


def test_config_show_json_is_masked(clean_env: Path) -> None:
    write_dotenv(clean_env, anthropic_api_key=ANTHROPIC_KEY, model="claude-x")
    result = run_show(
        "--json",
        env={
            "TOOLTRAIL_OPENAI_API_KEY": OPENAI_KEY,
            "TOOLTRAIL_CODEC_KEYS": f"k1:{KEY_A}",
            "TOOLTRAIL_DATABASE_URL": f"postgresql://app:{DB_PASSWORD}@db/audit",
        },
    )
    assert result.exit_code == 0, result.output
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, KEY_A, DB_PASSWORD):
        assert secret not in result.output
    shown = json.loads(result.stdout)
    assert shown["openai_api_key"] == MASK
    assert shown["anthropic_api_key"] == MASK
    assert shown["codec_keys"] == MASK
    assert shown["temporal_api_key"] == UNSET
    assert shown["database_url"] == "postgresql://app:****@db/audit"
    assert shown["model"] == "claude-x"
    assert shown["task_queue"] == "tooltrail"


def test_config_show_table_names_sources_and_masks(clean_env: Path) -> None:
    write_dotenv(clean_env, anthropic_api_key=ANTHROPIC_KEY, model="claude-x")
    result = run_show(env={"TOOLTRAIL_OPENAI_API_KEY": OPENAI_KEY})
    assert result.exit_code == 0, result.output
    assert OPENAI_KEY not in result.output and ANTHROPIC_KEY not in result.output
    rows = {
        cells[0]: cells[1:]
        for line in result.output.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 3
    }
    assert rows["openai_api_key"] == [MASK, "env"]
    assert rows["anthropic_api_key"] == [MASK, ".env"]
    assert rows["model"] == ["claude-x", ".env"]
    assert rows["temporal_api_key"] == [UNSET, "default"]
    assert rows["namespace"] == ["default", "default"]


def test_config_show_reports_invalid_settings_without_the_value(clean_env: Path) -> None:
    bad = "k1:" + OPENAI_KEY  # not base64: rejected, and must not be printed
    result = run_show(env={"TOOLTRAIL_CODEC_KEYS": bad})
    assert result.exit_code == 2
    assert "invalid settings" in result.stderr
    assert "codec key 'k1' is not valid base64" in result.stderr
    assert OPENAI_KEY not in result.output


def test_config_is_a_group_with_show() -> None:
    result = CliRunner().invoke(config_app, ["--help"])
    assert result.exit_code == 0
    assert "show" in result.output
