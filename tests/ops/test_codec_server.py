"""``tooltrail codec-server``: the HTTP contract, and the real Temporal CLI reading through it."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import signal
import socket
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.support.cli_runner import ROOT, TOOLTRAIL, env_for, run_cli
from tooltrail import ConfigurationError, Host, ToolCall, Tooltrail, tool
from tooltrail.db.store import AuditStore
from tooltrail.ops.codec_server import ALLOWED_HEADERS, COOKIE, build_app
from tooltrail.runtime.codec import ENCODING, AesGcmCodec, generate_key
from tooltrail.runtime.embedded import find_binary
from tooltrail.runtime.worker import build_worker, settings_data_converter
from tooltrail.settings import Settings
from tooltrail.tools.scratch import ScratchDirs

TOKEN = "test-token-" + uuid.uuid4().hex
KEYS = f"ui:{generate_key()}"
UI = "http://localhost:8233"
SECRET = f"shown-only-with-the-token-{uuid.uuid4().hex}"


def as_json(payloads: list[Payload]) -> dict[str, Any]:
    """Temporal's JSON form of ``Payloads``, as the UI sends it."""
    return {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in p.metadata.items()},
                "data": base64.b64encode(p.data).decode(),
            }
            for p in payloads
        ]
    }


def from_json(body: dict[str, Any]) -> list[Payload]:
    return [
        Payload(
            metadata={k: base64.b64decode(v) for k, v in p.get("metadata", {}).items()},
            data=base64.b64decode(p.get("data", "")),
        )
        for p in body["payloads"]
    ]


PLAIN = [
    Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"card": SECRET}).encode()),
    Payload(metadata={"encoding": b"binary/null"}),
]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(AesGcmCodec.from_setting(KEYS), token=TOKEN, origins=[UI])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://codec") as client:
        yield client


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_encode_then_decode_round_trips_for_the_token_holder(
    http: httpx.AsyncClient,
) -> None:
    encoded = await http.post("/encode", json=as_json(PLAIN), headers=BEARER)
    assert encoded.status_code == 200, encoded.text
    sealed = from_json(encoded.json())
    assert [p.metadata["encoding"] for p in sealed] == [ENCODING, ENCODING]
    assert SECRET not in encoded.text and SECRET.encode() not in sealed[0].data
    decoded = await http.post("/decode", json=encoded.json(), headers=BEARER)
    assert decoded.status_code == 200, decoded.text
    assert from_json(decoded.json()) == PLAIN
    # Payloads that are not encrypted pass through; an empty list is an empty list.
    assert (
        from_json((await http.post("/decode", json=as_json(PLAIN), headers=BEARER)).json()) == PLAIN
    )
    empty = await http.post("/decode", json={"payloads": []}, headers=BEARER)
    assert empty.json() == {"payloads": []}


@pytest.mark.parametrize(
    "authorization",
    [None, "", f"Bearer {TOKEN}x", f"bearer {TOKEN}", TOKEN, f"Basic {TOKEN}"],
    ids=["none", "empty", "wrong", "lowercase-scheme", "no-scheme", "basic"],
)
async def test_requests_without_the_token_are_refused(
    http: httpx.AsyncClient, authorization: str | None
) -> None:
    sealed = await AesGcmCodec.from_setting(KEYS).encode(PLAIN)
    headers = {} if authorization is None else {"Authorization": authorization}
    for path, body in (("/decode", as_json(sealed)), ("/encode", as_json(PLAIN))):
        answer = await http.post(path, json=body, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
        assert SECRET not in answer.text


async def test_cors_for_the_ui_origin_only(http: httpx.AsyncClient) -> None:
    ask = {
        "Origin": UI,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-namespace",
    }
    preflight = await http.options("/decode", headers=ask)
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == UI
    assert preflight.headers["access-control-allow-credentials"] == "true"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed = {
        h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")
    }
    assert {"content-type", "authorization", "x-namespace"} <= allowed
    assert ALLOWED_HEADERS == "Content-Type, Authorization, X-Namespace"

    stranger = await http.options("/decode", headers={**ask, "Origin": "https://evil.example"})
    assert stranger.status_code == 403
    assert "access-control-allow-origin" not in stranger.headers

    # The answers themselves carry the CORS headers the browser needs to read them.
    ok = await http.post("/encode", json=as_json(PLAIN), headers={**BEARER, "Origin": UI})
    assert ok.headers["access-control-allow-origin"] == UI
    refused = await http.post("/encode", json=as_json(PLAIN), headers={"Origin": UI})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == UI


async def test_bad_requests_say_what_is_wrong(http: httpx.AsyncClient) -> None:
    garbage = await http.post("/decode", content=b"{not json", headers=BEARER)
    assert garbage.status_code == 400 and "payloads" in garbage.json()["error"]
    foreign = await AesGcmCodec({"other": os.urandom(32)}, "other").encode(PLAIN)
    unknown = await http.post("/decode", json=as_json(foreign), headers=BEARER)
    assert unknown.status_code == 400
    assert "unknown encryption key id 'other'" in unknown.json()["error"]
    assert (await http.get("/decode", headers=BEARER)).status_code == 405
    assert (await http.post("/elsewhere", headers=BEARER)).status_code == 404


async def test_a_browser_signs_in_once_and_then_decodes_with_the_cookie(
    http: httpx.AsyncClient,
) -> None:
    sealed = as_json(await AesGcmCodec.from_setting(KEYS).encode(PLAIN))
    form = await http.get("/login")
    assert form.status_code == 200 and 'name="token"' in form.text
    wrong = await http.post("/login", data={"token": "x" * 20})
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert (await http.post("/decode", json=sealed)).status_code == 401

    signed_in = await http.post("/login", data={"token": TOKEN})
    assert signed_in.status_code == 200
    cookie = signed_in.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie and "Max-Age=43200" in cookie
    # The UI's request, with "include cross-origin credentials": no Authorization header.
    decoded = await http.post("/decode", json=sealed, headers={"Origin": UI})
    assert decoded.status_code == 200 and from_json(decoded.json()) == PLAIN

    http.cookies.set(COOKIE, TOKEN + "x")
    assert (await http.post("/decode", json=sealed)).status_code == 401


def test_a_short_token_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        build_app(AesGcmCodec.from_setting(KEYS), token="short", origins=[UI])


def test_the_command_refuses_to_start_without_a_token_or_keys(tmp_path: Path) -> None:
    no_token = run_cli(
        ["codec-server"], tmp_path, TOOLTRAIL_CODEC_KEYS=KEYS, TOOLTRAIL_CODEC_SERVER_TOKEN=""
    )
    assert no_token.returncode == 1
    assert "needs a bearer token: set TOOLTRAIL_CODEC_SERVER_TOKEN" in no_token.stderr
    no_keys = run_cli(
        ["codec-server"], tmp_path, TOOLTRAIL_CODEC_KEYS="", TOOLTRAIL_CODEC_SERVER_TOKEN=TOKEN
    )
    assert no_keys.returncode == 1 and "needs TOOLTRAIL_CODEC_KEYS" in no_keys.stderr


# -- the real server process ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def codec_server(tmp_path: Path) -> Iterator[Any]:
    """Start ``tooltrail codec-server`` processes; they are stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> tuple[int, subprocess.Popen[str]]:
        port = free_port()
        proc = subprocess.Popen(
            [*TOOLTRAIL, "codec-server", "--port", str(port), *args],
            cwd=ROOT,
            env=env_for(
                tmp_path, TOOLTRAIL_CODEC_KEYS=KEYS, TOOLTRAIL_CODEC_SERVER_TOKEN=TOKEN, **env
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return port, proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)  # also closes the pipes
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


async def wait_for(url: str, proc: subprocess.Popen[str], **client: Any) -> None:
    for _ in range(300):
        assert proc.poll() is None, proc.communicate()
        try:
            async with httpx.AsyncClient(**client) as http:
                await http.post(url, json={"payloads": []})
            return
        except httpx.TransportError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"the codec server at {url} never answered")


async def test_the_server_serves_https_with_the_given_certificate(
    codec_server: Any, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    port, proc = codec_server("--tls-cert", str(cert), "--tls-key", str(key))
    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(cert))
    await wait_for(f"{url}/decode", proc, verify=trust)
    sealed = await AesGcmCodec.from_setting(KEYS).encode(PLAIN)
    async with httpx.AsyncClient(verify=trust) as http:
        decoded = await http.post(f"{url}/decode", json=as_json(sealed), headers=BEARER)
        refused = await http.post(f"{url}/decode", json=as_json(sealed))
    assert decoded.status_code == 200 and from_json(decoded.json()) == PLAIN
    assert refused.status_code == 401
    # Stopped like a worker: SIGTERM, exit status 0.
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 30) == 0


MiB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The most memory the process has held at once (Linux's VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


async def flood(size: int, head: bytes = b"") -> AsyncIterator[bytes]:
    """``size`` bytes in 1 MiB chunks: sent unsized (chunked) unless a length is declared."""
    yield head
    sent = len(head)
    chunk = b"a" * MiB
    while sent < size:
        yield chunk[: size - sent]
        sent += len(chunk)


async def test_an_attacker_cannot_make_the_server_hold_a_big_body(codec_server: Any) -> None:
    # /login reads its body before any token is checked: anyone can post there.
    port, proc = codec_server(TOOLTRAIL_CODEC_SERVER_MAX_BODY_BYTES=str(MiB))
    url = f"http://127.0.0.1:{port}"
    await wait_for(f"{url}/decode", proc)
    sealed = as_json(await AesGcmCodec.from_setting(KEYS).encode(PLAIN))
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        # Warm up: what a first request allocates is not the attack's doing.
        assert (await http.post("/login", data={"token": "x" * 20})).status_code == 401
        assert (await http.post("/decode", json=sealed, headers=BEARER)).status_code == 200
        before = peak_rss(proc.pid)

        form = b"token=" + TOKEN.encode() + b"&pad="
        attacks = [
            # 64 MiB to /login: unsized (chunked), then with its length declared.
            ("/login", {}, flood(64 * MiB, form), "65536"),
            ("/login", {"Content-Length": str(64 * MiB)}, flood(64 * MiB, form), "65536"),
            # 32 MiB to /decode, over its configured 1 MiB, from the token's holder.
            ("/decode", BEARER, flood(32 * MiB, b'{"payloads": ['), str(MiB)),
            ("/decode", {**BEARER, "Content-Length": str(2 * MiB)}, flood(2 * MiB), str(MiB)),
        ]
        answers = [
            (path, await http.post(path, content=body, headers=headers), limit)
            for path, headers, body, limit in attacks
        ]
        # Before the limits were enforced while reading, /login alone grew it by 128 MiB.
        grown = peak_rss(proc.pid) - before
        assert grown < 16 * MiB, f"the server's peak memory grew by {grown / MiB:.0f} MiB"
        for path, answer, limit in answers:
            assert answer.status_code == 413, (path, answer.text)
            assert answer.json() == {
                "error": f"the request body exceeds the limit of {limit} bytes"
            }

        # Still serving, and a body within the limits is read as before.
        assert (await http.post("/decode", json=sealed, headers=BEARER)).status_code == 200
        signed_in = await http.post("/login", data={"token": TOKEN, "pad": "a" * 60_000})
        assert signed_in.status_code == 200 and COOKIE in signed_in.headers["set-cookie"]


@tool
def remember(card: str) -> str:
    """Answer with the card."""
    return f"remembered {card}"


async def test_the_temporal_cli_shows_plaintext_through_it_only_with_the_token(
    codec_server: Any, temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    client = await Client.connect(
        address,
        namespace=temporal_env.client.namespace,
        data_converter=settings_data_converter(Settings(codec_keys=KEYS)),
    )
    host = Host([remember])
    store = AuditStore(sqlite_url)
    queue = f"tq-codec-server-{uuid.uuid4()}"
    try:
        async with build_worker(
            client, host, task_queue=queue, store=store, scratch=ScratchDirs(tmp_path)
        ):
            tt = Tooltrail(client, host, task_queue=queue, store=store)
            turn = await tt.run_turn(
                [ToolCall("c1", "remember", {"card": SECRET})], session_id=f"s-{uuid.uuid4()}"
            )
    finally:
        await store.close()
    port, proc = codec_server()
    endpoint = f"http://127.0.0.1:{port}"
    await wait_for(f"{endpoint}/decode", proc)

    def show(*codec: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                find_binary("temporal"),
                "workflow",
                "show",
                "--workflow-id",
                turn.turn_id,
                "--address",
                address,
                "--output",
                "json",
                *codec,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        )

    through = await asyncio.to_thread(
        show, "--codec-endpoint", endpoint, "--codec-auth", f"Bearer {TOKEN}"
    )
    assert through.returncode == 0, through.stderr
    history_text = through.stdout
    # The CLI prints payload data in base64: the decoded turn input holds the card.
    assert SECRET in history_text or any(
        SECRET in base64.b64decode(chunk).decode("utf-8", "replace")
        for chunk in _base64_strings(history_text)
    )
    without = await asyncio.to_thread(show)
    assert without.returncode == 0, without.stderr
    assert "YmluYXJ5L2VuY3J5cHRlZA==" in without.stdout  # base64 of binary/encrypted
    assert not any(
        SECRET in base64.b64decode(chunk).decode("utf-8", "replace")
        for chunk in _base64_strings(without.stdout)
    )
    wrong = await asyncio.to_thread(
        show, "--codec-endpoint", endpoint, "--codec-auth", "Bearer not-the-token-at-all"
    )
    # The CLI retries a refused codec call until its deadline, then gives up.
    assert wrong.returncode != 0
    assert SECRET not in wrong.stdout


def _base64_strings(text: str) -> list[str]:
    found = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and len(value) % 4 == 0 and len(value) >= 8:
            try:
                base64.b64decode(value, validate=True)
            except ValueError:
                return
            found.append(value)

    walk(json.loads(text))
    return found
