"""An approver's side of signed approvals: key files, and signing a statement.

The private key stays with the approver (a PKCS#8 PEM file, as ``openssl genpkey
-algorithm ed25519`` writes it, or ``tooltrail approvers keygen``); the deployment knows
only the public key, as base64 of its 32 raw bytes (``TOOLTRAIL_APPROVERS``). Checking a
signature is ``tooltrail.core.signatures``' job, in pure code the workflow can run.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tooltrail.core.signatures import ApprovalStatement, SignedApproval
from tooltrail.errors import ConfigurationError

__all__ = [
    "generate_approver_key",
    "load_approver_key",
    "public_key_text",
    "sign_statement",
    "write_approver_key",
]


def generate_approver_key() -> Ed25519PrivateKey:
    """A new Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The key's public half as the deployment lists it: base64 of the 32 raw bytes."""
    raw = key.public_key().public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode("ascii")


def write_approver_key(key: Ed25519PrivateKey, path: Path) -> None:
    """Write the private key as unencrypted PKCS#8 PEM, readable by its owner only.

    Raises:
        FileExistsError: the file exists (a key is never overwritten).
    """
    pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)


def load_approver_key(source: Path | bytes | Ed25519PrivateKey) -> Ed25519PrivateKey:
    """Load an approver's private key from a PEM file, PEM bytes, or take a key as it is.

    Raises:
        ConfigurationError: unreadable, encrypted, or not an Ed25519 private key.
    """
    if isinstance(source, Ed25519PrivateKey):
        return source
    try:
        pem = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the approver key: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"not a usable PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigurationError("the approver key must be an Ed25519 key")
    return key


def sign_statement(statement: ApprovalStatement, key: Ed25519PrivateKey) -> SignedApproval:
    """Sign a statement with the approver's private key."""
    signature = key.sign(statement.canonical())
    return SignedApproval(statement=statement, signature=base64.b64encode(signature).decode())
