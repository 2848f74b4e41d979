"""The AES-GCM payload codec: unit tests, and a real server's history holding no plaintext."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from tooltrail import ConfigurationError, Host, ToolCall, Tooltrail, tool
from tooltrail.core.wire import TurnOutput
from tooltrail.db.store import AuditStore
from tooltrail.runtime.codec import (
    ENCODING,
    FORMAT_VERSION,
    KEY_ID_METADATA,
    VERSION_METADATA,
    AesGcmCodec,
    PayloadDecryptionError,
    data_converter,
    generate_key,
)
from tooltrail.runtime.converter import wire_data_converter
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

K1 = os.urandom(32)
K2 = os.urandom(32)


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def plain(data: bytes = b'{"text":"hello"}', encoding: bytes = b"json/plain") -> Payload:
    return Payload(metadata={"encoding": encoding, "extra": b"kept"}, data=data)


# -- round trip, rotation, tampering ---------------------------------------------------------


async def test_round_trip_restores_every_payload_exactly() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    originals = [plain(), plain(b""), plain(b"\x00\xff" * 1000, b"binary/plain")]
    encoded = await codec.encode(originals)
    assert len(encoded) == 3
    for original, sealed in zip(originals, encoded, strict=True):
        assert dict(sealed.metadata) == {
            "encoding": ENCODING,
            KEY_ID_METADATA: b"k1",
            VERSION_METADATA: FORMAT_VERSION,
        }
        assert original.data not in sealed.data or not original.data
        assert b"json/plain" not in sealed.data  # the original metadata is encrypted too
    assert await codec.decode(encoded) == originals


async def test_encode_does_not_mutate_and_uses_a_fresh_nonce_each_time() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    original = plain()
    snapshot = original.SerializeToString()
    first, second = await codec.encode([original, original])
    assert original.SerializeToString() == snapshot
    assert first.data[:12] != second.data[:12]
    assert first.data != second.data


async def test_rotation_old_payloads_still_decrypt_new_ones_use_the_active_key() -> None:
    before = AesGcmCodec({"k1": K1}, "k1")
    old = await before.encode([plain(b'"old"')])
    after = AesGcmCodec({"k2": K2, "k1": K1}, "k2")
    new = await after.encode([plain(b'"new"')])
    assert old[0].metadata[KEY_ID_METADATA] == b"k1"
    assert new[0].metadata[KEY_ID_METADATA] == b"k2"
    assert [p.data for p in await after.decode(old + new)] == [b'"old"', b'"new"']


async def test_rotation_through_the_setting_first_entry_is_active() -> None:
    old = await AesGcmCodec.from_setting(f"k1:{b64(K1)}").encode([plain(b'"old"')])
    rotated = AesGcmCodec.from_setting(f"k2:{b64(K2)},k1:{b64(K1)}")
    assert rotated.active_key_id == "k2"
    assert rotated.key_ids == ("k2", "k1")
    new = await rotated.encode([plain(b'"new"')])
    assert new[0].metadata[KEY_ID_METADATA] == b"k2"
    assert [p.data for p in await rotated.decode([*old, *new])] == [b'"old"', b'"new"']


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag"])
async def test_a_flipped_byte_fails_authentication(where: str) -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    (sealed,) = await codec.encode([plain()])
    data = bytearray(sealed.data)
    index = {"nonce": 0, "ciphertext": 14, "tag": len(data) - 1}[where]
    data[index] ^= 0x01
    tampered = Payload(metadata=dict(sealed.metadata), data=bytes(data))
    with pytest.raises(PayloadDecryptionError, match="authentication failed") as info:
        await codec.decode([tampered])
    assert "'k1'" in str(info.value)
    assert info.value.key_id == "k1"


async def test_the_metadata_is_bound_to_the_ciphertext() -> None:
    # Two keys under ids an attacker can swap: relabelling a payload, dropping its version
    # marker (to pass it off as a pre-release payload without associated data) or changing
    # its encoding all fail authentication.
    codec = AesGcmCodec({"k1": K1, "k2": K1}, "k1")
    (sealed,) = await codec.encode([plain()])
    assert await codec.decode([sealed]) == [plain()]
    relabelled = {**dict(sealed.metadata), KEY_ID_METADATA: b"k2"}
    downgraded = {k: v for k, v in sealed.metadata.items() if k != VERSION_METADATA}
    for metadata in (relabelled, downgraded):
        with pytest.raises(PayloadDecryptionError, match="authentication failed"):
            await codec.decode([Payload(metadata=metadata, data=sealed.data)])
    future = {**dict(sealed.metadata), VERSION_METADATA: b"3"}
    with pytest.raises(PayloadDecryptionError, match="unsupported encryption-version b'3'"):
        await codec.decode([Payload(metadata=future, data=sealed.data)])


async def test_pre_release_payloads_without_associated_data_still_decrypt() -> None:
    # Version 1 (no marker, no associated data), as tooltrail wrote before this format.
    original = plain(b'"written before the marker"')
    nonce = os.urandom(12)
    legacy = Payload(
        metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k1"},
        data=nonce + AESGCM(K1).encrypt(nonce, original.SerializeToString(), None),
    )
    assert await AesGcmCodec({"k1": K1}, "k1").decode([legacy]) == [original]


async def test_a_different_key_under_the_same_id_fails_authentication() -> None:
    (sealed,) = await AesGcmCodec({"k1": K1}, "k1").encode([plain()])
    with pytest.raises(PayloadDecryptionError, match="authentication failed"):
        await AesGcmCodec({"k1": K2}, "k1").decode([sealed])


async def test_truncated_and_missing_key_id_payloads_are_clear_errors() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    short = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k1"}, data=b"x" * 20)
    with pytest.raises(PayloadDecryptionError, match="too short"):
        await codec.decode([short])
    no_id = Payload(metadata={"encoding": ENCODING}, data=b"x" * 40)
    with pytest.raises(PayloadDecryptionError, match="no 'encryption-key-id' metadata"):
        await codec.decode([no_id])


async def test_unknown_key_id_names_the_id_and_never_a_key() -> None:
    (sealed,) = await AesGcmCodec({"old": K1}, "old").encode([plain()])
    codec = AesGcmCodec({"k2": K2}, "k2")
    with pytest.raises(PayloadDecryptionError) as info:
        await codec.decode([sealed])
    message = str(info.value)
    assert "unknown encryption key id 'old'" in message
    assert "k2" in message  # which ids are configured helps the operator
    assert info.value.key_id == "old"
    for key in (K1, K2):
        assert b64(key) not in message and key.hex() not in message


async def test_plain_payloads_pass_through_unchanged() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    payloads = [plain(), Payload(), Payload(metadata={"encoding": b"binary/null"})]
    decoded = await codec.decode(payloads)
    assert decoded == payloads
    assert all(a is b for a, b in zip(decoded, payloads, strict=True))
    (sealed,) = await codec.encode([plain()])
    mixed = await codec.decode([plain(b"1"), sealed, plain(b"2")])
    assert [p.data for p in mixed] == [b"1", b'{"text":"hello"}', b"2"]


def test_repr_shows_key_ids_only() -> None:
    codec = AesGcmCodec({"k1": K1, "k2": K2}, "k2")
    text = repr(codec)
    assert text == "AesGcmCodec(active_key_id='k2', key_ids=('k1', 'k2'))"
    assert b64(K1) not in text and K1.hex() not in text


# -- construction and the setting --------------------------------------------------------------


def test_generate_key_is_base64_of_32_random_bytes() -> None:
    first, second = generate_key(), generate_key()
    assert len(base64.b64decode(first, validate=True)) == 32
    assert first != second
    assert AesGcmCodec.from_setting(f"kid:{first}").key_ids == ("kid",)


def test_from_setting_tolerates_spaces_trailing_comma_and_urlsafe_base64() -> None:
    urlsafe = base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode()
    assert "-" in urlsafe or "_" in urlsafe
    codec = AesGcmCodec.from_setting(f"  a : {b64(K1)} ,b:{urlsafe},")
    assert codec.key_ids == ("a", "b")
    assert codec.active_key_id == "a"


SHORT = base64.b64encode(os.urandom(16)).decode()
LONG = base64.b64encode(os.urandom(48)).decode()
GOOD = base64.b64encode(os.urandom(32)).decode()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no key given"),
        (" , ,", "no key given"),
        (GOOD, r"entry 1: expected '<key id>:<base64 key>'"),
        (f":{GOOD}", r"entry 1: expected '<key id>:<base64 key>'"),
        (f"k1:{GOOD},{GOOD}", r"entry 2: expected '<key id>:<base64 key>'"),
        (f"{GOOD}:k1", "entry 1: the key id looks like a key"),
        ("k1:", r"entry 1 \(key id 'k1'\): the key is empty"),
        (f"k1:{GOOD},k2:{SHORT}", r"entry 2 \(key id 'k2'\): the key decodes to 16 bytes"),
        (f"k1:{LONG}", r"key id 'k1'\): the key decodes to 48 bytes; AES-256-GCM needs"),
        (f"k1:{GOOD[:-2]}!!", r"key id 'k1'\): the key is not valid base64"),
        (f"k1:{GOOD[:-1]}", r"key id 'k1'\): the key is not valid base64"),
        (f"k1:{GOOD},k1:{GOOD}", r"entry 2: key id 'k1' appears twice"),
    ],
    ids=[
        "empty",
        "only-commas",
        "bare-key",
        "empty-id",
        "second-bare-key",
        "swapped",
        "empty-key",
        "16-bytes",
        "48-bytes",
        "not-base64",
        "bad-padding",
        "duplicate-id",
    ],
)
def test_from_setting_errors_are_clear_and_never_echo_key_material(
    text: str, expected: str
) -> None:
    with pytest.raises(ConfigurationError, match=expected) as info:
        AesGcmCodec.from_setting(text)
    message = str(info.value)
    for secret in (GOOD, SHORT, LONG, GOOD[:-2], GOOD[:-1], GOOD[:12]):
        assert secret not in message
    # No chained exception (binascii's, say) carries the text along either.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.mark.parametrize(
    ("keys", "active", "expected"),
    [
        ({}, "k1", "at least one key"),
        ({"k1": b"short"}, "k1", "key 'k1' is 5 bytes; AES-256-GCM needs exactly 32"),
        ({"k1": K1}, "k2", r"active payload encryption key id 'k2' is not among .*\(k1\)"),
        ({"": K1}, "", "non-empty"),
        ({"a,b": K1}, "a,b", "may not contain"),
        ({"k1": "not bytes"}, "k1", "must be bytes, not str"),
    ],
)
def test_constructor_validates_keys(keys: dict[str, bytes], active: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected) as info:
        AesGcmCodec(keys, active)
    assert K1.hex() not in str(info.value)


# -- the data converter ------------------------------------------------------------------------


def test_data_converter_is_tooltrails_converter_with_the_codec() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    converter = data_converter(codec)
    assert converter.payload_codec is codec
    assert converter.payload_converter_class is wire_data_converter.payload_converter_class
    assert converter.failure_converter_class is wire_data_converter.failure_converter_class
    assert wire_data_converter.payload_codec is None  # the shared converter is untouched
    assert data_converter(None) is wire_data_converter


async def test_data_converter_encrypts_pydantic_values_end_to_end() -> None:
    converter = data_converter(AesGcmCodec({"k1": K1}, "k1"))
    output = TurnOutput(turn_id="t", results=[])
    (payload,) = await converter.encode([output])
    assert payload.metadata["encoding"] == ENCODING
    assert await converter.decode([payload], [TurnOutput]) == [output]


async def test_encode_failure_messages_moves_the_text_into_the_encrypted_payload() -> None:
    secret = f"failure-secret-{uuid.uuid4().hex}"
    codec = AesGcmCodec({"k1": K1}, "k1")
    for converter, leaks in (
        (data_converter(codec), True),
        (data_converter(codec, encode_failure_messages=True), False),
    ):
        failure = Failure()
        await converter.encode_failure(ApplicationError(secret, type="Boom"), failure)
        assert (secret.encode() in failure.SerializeToString()) is leaks
        decoded = await converter.decode_failure(failure)
        assert secret in str(decoded)


# -- a real server ------------------------------------------------------------------------------

ARG_SECRET = f"ARG-SECRET-{uuid.uuid4().hex}"
OUT_SECRET = f"OUT-SECRET-{uuid.uuid4().hex}"


@tool
async def confide(text: str) -> str:
    """Return the text together with a secret only the tool knows."""
    return f"{text} | {OUT_SECRET}"


def iter_payloads(message: Message) -> Iterator[Payload]:
    """Every ``Payload`` anywhere inside a protobuf message."""
    if isinstance(message, Payload):
        yield message
        return
    for _field, value in message.ListFields():
        if isinstance(value, Message):
            yield from iter_payloads(value)
            continue
        items = value.values() if hasattr(value, "values") else value
        if isinstance(items, str | bytes | int | float | bool):
            continue
        for item in items:
            if isinstance(item, Message):
                yield from iter_payloads(item)


def user_payloads(event: HistoryEvent) -> Iterator[Payload]:
    """The payloads of an event that went through the data converter.

    The SDK's core writes some bookkeeping of its own in plain JSON, never user data: a
    patch marker's ``patch-data``, a local activity marker's ``data`` (sequence, attempt,
    activity type) and the ``TemporalChangeVersion`` search attribute of a patch.
    """
    if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
        for key, details in event.marker_recorded_event_attributes.details.items():
            if key not in ("patch-data", "data"):
                yield from iter_payloads(details)
        return
    if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
        for key, payload in fields.indexed_fields.items():
            if key != "TemporalChangeVersion":
                yield payload
        return
    yield from iter_payloads(event)


def base64_forms(secret: str) -> list[str]:
    """The secret's base64 at each of the three alignments it could have inside a blob."""
    forms = []
    for pad in range(3):
        encoded = base64.b64encode(b"\x00" * pad + secret.encode()).decode()
        # Drop the characters mixed with the padding bytes or the unknown following bytes.
        start = (pad * 4 + 2) // 3
        forms.append(encoded[start + 1 : -4])
    return forms


def leaks(history: WorkflowHistory, secret: str) -> list[str]:
    """Where ``secret`` can be read in a raw history (empty: nowhere)."""
    found = []
    raw = b"".join(event.SerializeToString() for event in history.events)
    if secret.encode() in raw:
        found.append("raw event bytes")
    text = history.to_json()
    if secret in text:
        found.append("history JSON")
    found.extend(
        f"history JSON as base64 {form!r}" for form in base64_forms(secret) if form in text
    )
    return found


async def run_confiding_turn(
    client: Client, sqlite_url: str, tmp_path: Path
) -> tuple[TurnOutput, WorkflowHistory]:
    host = Host([confide])
    task_queue = f"tq-codec-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(client, host, task_queue=task_queue, store=store)
    try:
        async with build_worker(
            client, host, task_queue=task_queue, store=store, scratch=ScratchDirs(tmp_path)
        ):
            turn = await tt.run_turn(
                [
                    ToolCall("c1", "confide", {"text": ARG_SECRET}),
                    ToolCall("c2", "confide", f'{{"text": "raw {ARG_SECRET}"}}'),
                ],
                session_id=f"session-{uuid.uuid4()}",
            )
            history = await client.get_workflow_handle(turn.turn_id).fetch_history()
    finally:
        await store.close()
    return turn, history


async def connect_with(env: WorkflowEnvironment, converter: DataConverter) -> Client:
    # tooltrail.runtime.worker.connect_client passes its own data_converter, so it cannot take one.
    return await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=converter,
    )


async def test_history_on_a_real_server_holds_no_plaintext(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    codec = AesGcmCodec.from_setting(f"live:{generate_key()}")
    client = await connect_with(temporal_env, data_converter(codec))
    turn, history = await run_confiding_turn(client, sqlite_url, tmp_path)

    # The turn worked: the worker decrypted its inputs and the client decrypted the result.
    assert [(r.tool_call_id, r.is_error, r.output) for r in turn.results] == [
        ("c1", False, f"{ARG_SECRET} | {OUT_SECRET}"),
        ("c2", False, f"raw {ARG_SECRET} | {OUT_SECRET}"),
    ]
    # Nothing readable: neither what went in, nor what the tool made up.
    assert leaks(history, ARG_SECRET) == []
    assert leaks(history, OUT_SECRET) == []
    payloads = [p for event in history.events for p in user_payloads(event)]
    assert len(payloads) >= 6  # the turn input and result, and each activity's in and out
    assert {p.metadata["encoding"] for p in payloads} == {ENCODING}
    assert {p.metadata[KEY_ID_METADATA] for p in payloads} == {b"live"}

    # A client without the key reads ciphertext only.
    opaque = temporal_env.client.get_workflow_handle(turn.turn_id, result_type=TurnOutput)
    with pytest.raises(Exception, match="binary/encrypted"):
        await opaque.result()


async def test_without_the_codec_the_same_check_finds_the_secrets(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    # The control: proves the leak check above can see plaintext when there is some.
    client = await connect_with(temporal_env, data_converter(None))
    turn, history = await run_confiding_turn(client, sqlite_url, tmp_path)
    assert not any(result.is_error for result in turn.results)
    assert "raw event bytes" in leaks(history, ARG_SECRET)
    assert "raw event bytes" in leaks(history, OUT_SECRET)
    # pydantic's JSON rides in payload bytes, which history JSON shows as base64.
    assert any(form.startswith("history JSON as base64") for form in leaks(history, OUT_SECRET))
