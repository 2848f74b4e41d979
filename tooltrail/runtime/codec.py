"""``AesGcmCodec``: AES-256-GCM encryption of every payload Temporal stores.

With the codec in the data converter, workflow inputs and results, activity inputs and
results (tool arguments, tool outputs, audit records riding along) reach the Temporal server
only as ciphertext; its history holds no plaintext of them. The worker and the client must
use the same keys.

Wire format (the layout of Temporal's encryption sample, plus associated data):

* metadata ``encoding: binary/encrypted``, ``encryption-key-id: <key id>`` and
  ``encryption-version: 2``;
* data ``nonce (12 random bytes) || AES-GCM ciphertext and tag`` of the original payload's
  protobuf bytes (``payload.SerializeToString()``), metadata included;
* the associated data binds that outer metadata to the ciphertext
  (``tooltrail/aes-256-gcm/2 NUL encoding NUL key id``): a payload whose key id, encoding or
  version was changed no longer authenticates. Use ``tooltrail codec-server`` to show
  payloads in the Temporal UI or CLI.

Payloads without ``encryption-version`` were written by pre-release tooltrail, without
associated data (version 1); they still decrypt, and nothing writes them any more. Removing
the marker from a version 2 payload does not turn it into version 1: its tag was computed
over the associated data, so it fails authentication.

Key rotation: new payloads are encrypted with the active key; any key id still configured
decrypts. Add the new key first (``new:...,old:...``), and drop the old one only once no open
workflow's history needs it.

Key material never appears in an error message, a ``repr`` or a log line; key ids do.

This module runs client-side and worker-side (the codec runs outside the workflow sandbox).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)

from tooltrail.errors import ConfigurationError, TooltrailError
from tooltrail.runtime.converter import wire_data_converter
from tooltrail.settings import Settings

__all__ = [
    "ENCODING",
    "FORMAT_VERSION",
    "KEY_ID_METADATA",
    "VERSION_METADATA",
    "AesGcmCodec",
    "PayloadDecryptionError",
    "codec_from_settings",
    "data_converter",
    "generate_key",
]

ENCODING = b"binary/encrypted"
"""The ``encoding`` metadata value of an encrypted payload."""
KEY_ID_METADATA = "encryption-key-id"
"""The metadata key naming the key that encrypted a payload."""
VERSION_METADATA = "encryption-version"
"""The metadata key of the format version (absent: version 1, no associated data)."""
FORMAT_VERSION = b"2"
"""The format ``encode`` writes: AES-256-GCM with the outer metadata as associated data."""
_AAD_PREFIX = b"tooltrail/aes-256-gcm/2\x00"


def _associated_data(key_id: bytes) -> bytes:
    """The associated data of a version 2 payload: its outer metadata, in a fixed order."""
    return _AAD_PREFIX + ENCODING + b"\x00" + key_id


KEY_BYTES = 32
"""AES-256: keys are 32 bytes."""
NONCE_BYTES = 12
"""The GCM nonce: 12 random bytes per payload."""
_TAG_BYTES = 16


class PayloadDecryptionError(TooltrailError, ValueError):
    """An encrypted payload cannot be decrypted.

    The message names the key id (never the key) and the reason: an unknown key id, a
    payload that fails authentication (tampered, or encrypted under another key with the
    same id), or a malformed payload.
    """

    def __init__(self, message: str, *, key_id: str | None = None) -> None:
        """Create the error.

        Args:
            message: what went wrong, with the key id.
            key_id: the payload's key id, when it has a readable one.
        """
        super().__init__(message)
        self.key_id = key_id


def generate_key() -> str:
    """Return a new random AES-256 key, base64-encoded, for ``kid:<key>`` settings.

    Example::

        python -c "from tooltrail.runtime.codec import generate_key; print(generate_key())"
    """
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def _check_key_id(key_id: object, where: str) -> str:
    if not isinstance(key_id, str) or not key_id.strip():
        raise ConfigurationError(f"{where}: a key id must be a non-empty string")
    if key_id != key_id.strip() or any(ch in key_id for ch in ",:") or not key_id.isprintable():
        raise ConfigurationError(
            f"{where}: key id {key_id!r} may not contain ',', ':', surrounding spaces "
            "or unprintable characters"
        )
    return key_id


class AesGcmCodec(PayloadCodec):
    """Encrypts payloads with AES-256-GCM under the active key; decrypts under any known key.

    Payloads that are not encrypted (no ``binary/encrypted`` encoding) decode unchanged, so
    histories written before the codec was enabled stay readable.
    """

    def __init__(self, keys: Mapping[str, bytes], active_key_id: str) -> None:
        """Create the codec.

        Args:
            keys: every usable key by key id; each key is 32 raw bytes.
            active_key_id: the key id that encrypts new payloads (one of ``keys``).

        Raises:
            ConfigurationError: no keys, a key that is not 32 bytes, an unusable key id, or
                an active key id that is not among the keys. The message never holds key
                material.
        """
        if not keys:
            raise ConfigurationError("payload encryption needs at least one key")
        ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys.items():
            _check_key_id(key_id, "payload encryption key")
            if not isinstance(key, bytes | bytearray):
                raise ConfigurationError(
                    f"payload encryption key {key_id!r} must be bytes, not {type(key).__name__}"
                )
            if len(key) != KEY_BYTES:
                raise ConfigurationError(
                    f"payload encryption key {key_id!r} is {len(key)} bytes; "
                    f"AES-256-GCM needs exactly {KEY_BYTES}"
                )
            ciphers[key_id] = AESGCM(bytes(key))
        if active_key_id not in ciphers:
            raise ConfigurationError(
                f"active payload encryption key id {active_key_id!r} is not among the "
                f"configured key ids ({', '.join(sorted(ciphers))})"
            )
        self._ciphers = ciphers
        self._active_key_id = active_key_id

    @classmethod
    def from_setting(cls, text: str) -> AesGcmCodec:
        """Parse ``kid1:base64key,kid2:base64key``; the first key is the active one.

        Spaces around entries are ignored, and so are empty entries (a trailing comma).
        Keys are standard or URL-safe base64 of 32 bytes (see ``generate_key``).

        Args:
            text: the setting's value.

        Raises:
            ConfigurationError: the text is empty, an entry has no key id, a key id repeats,
                a key is not base64 or not 32 bytes. The message names the entry's position
                and key id, never the key.
        """
        keys: dict[str, bytes] = {}
        entries = [entry.strip() for entry in text.split(",")]
        for position, entry in enumerate(entries, start=1):
            if not entry:
                continue
            where = f"payload encryption keys, entry {position}"
            key_id, colon, encoded = entry.partition(":")
            key_id = key_id.strip()
            if not colon or not key_id:
                # The entry may be a bare key: say what is missing, never what was there.
                raise ConfigurationError(f"{where}: expected '<key id>:<base64 key>'")
            if _looks_like_key(key_id):
                # Key and id swapped: refuse without echoing what sits in the id's place.
                raise ConfigurationError(
                    f"{where}: the key id looks like a key; expected '<key id>:<base64 key>'"
                )
            _check_key_id(key_id, where)
            if key_id in keys:
                raise ConfigurationError(f"{where}: key id {key_id!r} appears twice")
            keys[key_id] = _decode_key(encoded.strip(), f"{where} (key id {key_id!r})")
        if not keys:
            raise ConfigurationError(
                "payload encryption keys: no key given (expected 'kid1:base64key,kid2:...')"
            )
        return cls(keys, next(iter(keys)))

    @property
    def active_key_id(self) -> str:
        """The key id that encrypts new payloads."""
        return self._active_key_id

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id that decrypts, the active one included."""
        return tuple(self._ciphers)

    def __repr__(self) -> str:
        return f"AesGcmCodec(active_key_id={self._active_key_id!r}, key_ids={self.key_ids!r})"

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Encrypt every payload under the active key.

        Args:
            payloads: the payloads to encrypt (not mutated).

        Returns:
            One encrypted payload per input payload, in order.
        """
        cipher = self._ciphers[self._active_key_id]
        key_id = self._active_key_id.encode("utf-8")
        associated = _associated_data(key_id)
        encrypted = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            sealed = cipher.encrypt(nonce, payload.SerializeToString(), associated)
            encrypted.append(
                Payload(
                    metadata={
                        "encoding": ENCODING,
                        KEY_ID_METADATA: key_id,
                        VERSION_METADATA: FORMAT_VERSION,
                    },
                    data=nonce + sealed,
                )
            )
        return encrypted

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Decrypt the encrypted payloads; pass the others through unchanged.

        Args:
            payloads: the payloads to decode (not mutated).

        Returns:
            One payload per input payload, in order.

        Raises:
            PayloadDecryptionError: an encrypted payload names an unknown key id, fails
                authentication, or is malformed.
        """
        return [self._decrypt(payload) for payload in payloads]

    def _decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        raw_id = payload.metadata.get(KEY_ID_METADATA)
        if raw_id is None:
            raise PayloadDecryptionError(
                f"cannot decrypt payload: it has no {KEY_ID_METADATA!r} metadata"
            )
        try:
            key_id = raw_id.decode("utf-8")
        except UnicodeDecodeError:
            raise PayloadDecryptionError(
                f"cannot decrypt payload: its key id {raw_id!r} is not UTF-8"
            ) from None
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadDecryptionError(
                f"cannot decrypt payload: unknown encryption key id {key_id!r} "
                f"(configured key ids: {', '.join(self._ciphers)}); "
                "add that key to the payload encryption keys",
                key_id=key_id,
            )
        version = payload.metadata.get(VERSION_METADATA)
        if version is None:
            associated = None  # version 1: pre-release payloads, no associated data
        elif version == FORMAT_VERSION:
            associated = _associated_data(raw_id)
        else:
            raise PayloadDecryptionError(
                f"cannot decrypt payload under key id {key_id!r}: unsupported "
                f"{VERSION_METADATA} {version!r} (this tooltrail writes {FORMAT_VERSION!r}); "
                "upgrade tooltrail",
                key_id=key_id,
            )
        data = payload.data
        if len(data) < NONCE_BYTES + _TAG_BYTES:
            raise PayloadDecryptionError(
                f"cannot decrypt payload under key id {key_id!r}: "
                f"{len(data)} bytes is too short to be AES-GCM ciphertext",
                key_id=key_id,
            )
        try:
            plaintext = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], associated)
        except InvalidTag:
            raise PayloadDecryptionError(
                f"cannot decrypt payload under key id {key_id!r}: authentication failed "
                "(the payload or its metadata was altered, or it was encrypted with a "
                "different key of that id)",
                key_id=key_id,
            ) from None
        try:
            return Payload.FromString(plaintext)
        except DecodeError:
            raise PayloadDecryptionError(
                f"cannot decrypt payload under key id {key_id!r}: "
                "the decrypted bytes are not a Temporal payload",
                key_id=key_id,
            ) from None


def _looks_like_key(text: str) -> bool:
    """Whether ``text`` is base64 of exactly 32 bytes."""
    try:
        decoded = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(decoded) == KEY_BYTES


def _decode_key(encoded: str, where: str) -> bytes:
    """Decode a base64 key; errors name ``where`` and never echo the text."""
    if not encoded:
        raise ConfigurationError(f"{where}: the key is empty")
    alphabet = encoded.replace("-", "+").replace("_", "/")
    try:
        key = base64.b64decode(alphabet, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            f"{where}: the key is not valid base64 (generate one with "
            "`python -c 'from tooltrail.runtime.codec import generate_key; print(generate_key())'`)"
        ) from None
    if len(key) != KEY_BYTES:
        raise ConfigurationError(
            f"{where}: the key decodes to {len(key)} bytes; AES-256-GCM needs exactly {KEY_BYTES}"
        )
    return key


def codec_from_settings(settings: Settings) -> AesGcmCodec | None:
    """Return the codec of the settings' keys, or ``None`` when none are configured.

    ``TOOLTRAIL_CODEC_KEYS`` lists the keys; ``TOOLTRAIL_CODEC_KEY_ID`` (default: the first)
    encrypts new payloads.
    """
    if settings.codec_keys is None:
        return None
    return AesGcmCodec(settings.codec_key_ring(), settings.active_codec_key_id() or "")


def data_converter(
    codec: PayloadCodec | None, *, encode_failure_messages: bool = False
) -> DataConverter:
    """Return tooltrail's data converter with ``codec`` applied to every payload.

    Args:
        codec: the payload codec (e.g. an ``AesGcmCodec``), or ``None`` for none.
        encode_failure_messages: also move failure messages and stack traces into an
            (encrypted) payload. Without it, the text of exceptions that fail an activity or
            workflow (not tool errors: those are results) stays readable in the history.

    Returns:
        ``tooltrail.runtime.converter.wire_data_converter`` with the codec; the very converter
        itself without one.
    """
    if codec is None and not encode_failure_messages:
        return wire_data_converter
    if encode_failure_messages:
        return dataclasses.replace(
            wire_data_converter,
            payload_codec=codec,
            failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
        )
    return dataclasses.replace(wire_data_converter, payload_codec=codec)
