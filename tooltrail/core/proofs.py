"""Proofs a worker gives its own decisions, checkable where a tool body runs.

A turn hands its tool attempts decisions a namespace client could also write into an
activity's input: "a human approved this call, skip the pre-tool hooks". The flag alone proves
nothing (anyone who can start a workflow can schedule ``tooltrail.tool.execute`` with it), so
the worker that accepted the approval adds a proof: an HMAC-SHA256, under the deployment's
worker key, over the Temporal workflow id and run id, the call and its arguments' digest. The
activity that runs the body checks it against ``activity.info()``, whose workflow id and run id
the Temporal server sets: a proof copied out of one history into another workflow's input is
worth nothing there.

Keys are ``kid:base64key`` entries (``TOOLTRAIL_WORKER_KEY``), the first makes proofs and
every one listed checks them, so a key is rotated without downtime: list the new key second on
every worker, then first, then drop the old one. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

__all__ = [
    "PROOF_DOMAIN",
    "WORKER_KEY_MIN_BYTES",
    "approval_proof",
    "approvers_fingerprint",
    "check_approval_proof",
    "check_row_mac",
    "parse_worker_keys",
    "row_mac",
    "signature_fingerprint",
    "tie_break",
]

PROOF_DOMAIN = b"tooltrail approval proof v1\n"
"""Prefix of the MAC'd bytes: a MAC over them means nothing anywhere else."""
ROW_DOMAIN = b"tooltrail directory row v1\n"
"""Prefix of a published row's MAC'd bytes."""
TIE_DOMAIN = b"tooltrail tie break v1\n"
"""Prefix of the keyed order among peers."""
WORKER_KEY_MIN_BYTES = 32
"""The shortest worker key accepted (HMAC-SHA256's block of entropy)."""


def parse_worker_keys(text: str) -> dict[str, bytes]:
    """Parse ``kid1:base64key,kid2:base64key`` into an ordered ``{kid: key}`` mapping.

    Error messages name key ids and positions, never key material.

    Raises:
        ValueError: an entry is malformed, an id repeats or contains ``.``, or a key is
            shorter than ``WORKER_KEY_MIN_BYTES``.
    """
    keys: dict[str, bytes] = {}
    for position, entry in enumerate((e.strip() for e in text.split(",")), start=1):
        if not entry:
            continue
        kid, colon, encoded = entry.partition(":")
        kid = kid.strip()
        if not colon or not kid or not encoded.strip() or "." in kid:
            raise ValueError(
                f"worker key #{position} is not 'KEY_ID:BASE64_KEY' (an id without '.'); "
                "TOOLTRAIL_WORKER_KEY is 'kid1:base64key,kid2:base64key'"
            )
        if kid in keys:
            raise ValueError(f"worker key id {kid!r} appears twice")
        alphabet = encoded.strip().replace("-", "+").replace("_", "/")
        try:
            key = base64.b64decode(alphabet, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"worker key {kid!r} is not valid base64") from None
        if len(key) < WORKER_KEY_MIN_BYTES:
            raise ValueError(
                f"worker key {kid!r} decodes to {len(key)} bytes; at least "
                f"{WORKER_KEY_MIN_BYTES} are needed"
            )
        keys[kid] = key
    return keys


def _hmac(key: bytes, domain: bytes, fields: tuple[str, ...]) -> str:
    # Length-prefixed fields: no choice of values can make two different tuples MAC alike.
    message = domain + b"".join(
        len(part).to_bytes(4, "big") + part
        for part in (field.encode("utf-8", "surrogatepass") for field in fields)
    )
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _mac(key: bytes, workflow_id: str, run_id: str, tool_call_id: str, digest: str) -> str:
    return _hmac(key, PROOF_DOMAIN, (workflow_id, run_id, tool_call_id, digest))


def row_mac(keys: Mapping[str, bytes], *fields: str) -> str:
    """A worker's MAC over a row it publishes (the registry directory): ``kid.hexmac``.

    Empty when there is no key (a row without a MAC is ignored by peers).
    """
    if not keys:
        return ""
    kid, key = next(iter(keys.items()))
    return f"{kid}.{_hmac(key, ROW_DOMAIN, fields)}"


def check_row_mac(keys: Mapping[str, bytes], mac: str, *fields: str) -> bool:
    """Whether ``mac`` is one of ``keys``' over exactly these fields."""
    kid, dot, value = mac.partition(".")
    key = keys.get(kid)
    if not dot or key is None:
        return False
    return hmac.compare_digest(_hmac(key, ROW_DOMAIN, fields), value)


def tie_break(keys: Mapping[str, bytes], *fields: str) -> str:
    """An order among peers that no peer can choose: a keyed digest of the fields.

    Sorting candidates by it (rather than by a fingerprint a peer picks with its tool set)
    spreads the choice in a way only a holder of the worker key could steer.
    """
    if not keys:
        return "|".join(fields)
    return _hmac(next(iter(keys.values())), TIE_DOMAIN, fields)


def approvers_fingerprint(approvers: Mapping[str, str]) -> str:
    """A short digest of an approver set (names and keys); empty for none (unsigned)."""
    if not approvers:
        return ""
    text = "\n".join(f"{name}:{approvers[name]}" for name in sorted(approvers))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def approval_proof(
    keys: Mapping[str, bytes],
    *,
    workflow_id: str,
    run_id: str,
    tool_call_id: str,
    arguments_sha256: str,
) -> str:
    """The proof that a worker accepted an approval of this call in this Temporal run.

    Made with the first key: ``kid.hexmac``.

    Raises:
        ValueError: ``keys`` is empty.
    """
    if not keys:
        raise ValueError("no worker key to make a proof with")
    kid, key = next(iter(keys.items()))
    return f"{kid}.{_mac(key, workflow_id, run_id, tool_call_id, arguments_sha256)}"


def check_approval_proof(
    keys: Mapping[str, bytes],
    proof: str,
    *,
    workflow_id: str,
    run_id: str,
    tool_call_id: str,
    arguments_sha256: str,
) -> bool:
    """Whether ``proof`` is one of ``keys``' over exactly this run, call and arguments."""
    kid, dot, mac = proof.partition(".")
    key = keys.get(kid)
    if not dot or key is None:
        return False
    expected = _mac(key, workflow_id, run_id, tool_call_id, arguments_sha256)
    return hmac.compare_digest(expected, mac)


def signature_fingerprint(signature: str) -> str | None:
    """SHA-256 (hex) of a base64 signature's decoded bytes; ``None`` if it is not base64.

    A signature's identity is its bytes: base64 has several spellings of the same bytes
    (padding bits, the URL-safe alphabet), so a "used" mark keyed by the text would let one
    signature count once per spelling.
    """
    try:
        raw = base64.b64decode(signature.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None
    return hashlib.sha256(raw).hexdigest()
