"""Signed approvals: the statement an approver signs, its canonical bytes, and its check.

An approval names the approver, the turn, the call, a digest of the call's canonical
arguments, the decision (with a denial's reason) and an expiry, and is signed with the
approver's Ed25519 key. The workflow's ``approval`` Update validator checks it here, so this
module is pure (no I/O, no clock, no randomness): the caller passes the time. Verification is
RFC 8032's, in plain Python, because the workflow layer loads no native crypto library
(``tests/test_layers.py``); signing, which needs the private key, happens with the approver
(``tooltrail.ops.approver_keys``, on ``cryptography``). One check takes a few milliseconds, and
only an Update's validator runs it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, field_validator

from tooltrail.core.proofs import signature_fingerprint
from tooltrail.core.text import canonical_json

__all__ = [
    "STATEMENT_DOMAIN",
    "ApprovalStatement",
    "SignedApproval",
    "arguments_digest",
    "canonical_arguments",
    "check_approval",
    "decode_public_key",
    "ed25519_verify",
    "parse_approvers",
    "signature_problem",
]

STATEMENT_DOMAIN = b"tooltrail approval v1\n"
"""Prefix of the signed bytes: a signature over a statement means nothing anywhere else."""


def canonical_arguments(arguments: Mapping[str, Any]) -> bytes:
    """The arguments as canonical JSON: sorted keys, no spaces, UTF-8, no NaN.

    Raises:
        ValueError: a value JSON cannot carry (NaN, infinity).
    """
    return canonical_json(arguments).encode("utf-8")


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical arguments, hex: what an approval binds the call's input to."""
    return hashlib.sha256(canonical_arguments(arguments)).hexdigest()


class ApprovalStatement(BaseModel):
    """What an approver signs: this decision, for this call with these arguments, until then."""

    approver: str
    """The approver's name, as the deployment's approvers list it."""
    turn_id: str
    tool_call_id: str
    arguments_sha256: str
    """``arguments_digest`` of the arguments the approver saw."""
    run_id: str | None = None
    """The Temporal run of the turn the approver answered (``tooltrail approve`` names it): a
    statement copied into a new run of the same workflow id is refused there. ``None`` (a
    statement signed before runs were named) binds no run; the single-use record across runs
    (``approval_use``) still refuses its second use."""
    decision: Literal["approve", "deny"]
    reason: str | None = None
    """A denial's reason (the model reads it), signed with the rest."""
    expires_at: datetime
    """After this instant the statement is worth nothing (UTC, whole seconds)."""

    @field_validator("expires_at")
    @classmethod
    def _whole_utc_seconds(cls, value: datetime) -> datetime:
        # The canonical form writes whole UTC seconds: signer and checker must agree on it.
        if value.tzinfo is None:
            raise ValueError("expires_at needs a time zone")
        return value.astimezone(UTC).replace(microsecond=0)

    def canonical(self) -> bytes:
        """The bytes that are signed: a domain prefix and the statement as canonical JSON."""
        fields = {
            "approver": self.approver,
            "arguments_sha256": self.arguments_sha256,
            "decision": self.decision,
            "expires_at": self.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "reason": self.reason,
            "tool_call_id": self.tool_call_id,
            "turn_id": self.turn_id,
        }
        if self.run_id is not None:
            # Only when set: statements signed without it keep verifying.
            fields["run_id"] = self.run_id
        return STATEMENT_DOMAIN + canonical_arguments(fields)


class SignedApproval(BaseModel):
    """A statement with its Ed25519 signature (base64 of the 64 bytes)."""

    statement: ApprovalStatement
    signature: str


def decode_public_key(text: str) -> bytes:
    """The 32 raw bytes of an Ed25519 public key written as base64.

    Raises:
        ValueError: not base64 of 32 bytes.
    """
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an approver's key is the base64 of a raw Ed25519 public key") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, this one {len(raw)}")
    return raw


def parse_approvers(text: str) -> dict[str, str]:
    """Parse ``name:base64key`` entries, separated by commas or lines (``#`` starts a comment).

    Raises:
        ValueError: an entry without a name or with a malformed key, or a name given twice.
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        for entry in line.split("#", 1)[0].split(","):
            entry = entry.strip()
            if not entry:
                continue
            name, colon, key = entry.rpartition(":")
            name = name.strip()
            if not colon or not name:
                raise ValueError(f"approver entry {entry!r} is not 'name:base64key'")
            if name in found:
                raise ValueError(f"approver {name!r} is listed twice")
            decode_public_key(key)
            found[name] = key.strip()
    return found


def signature_problem(signed: SignedApproval, approvers: Mapping[str, str]) -> str | None:
    """Why the signature is not the named approver's, or ``None`` when it verifies."""
    statement = signed.statement
    key = approvers.get(statement.approver)
    if key is None:
        return f"unknown approver {statement.approver!r}"
    try:
        signature = base64.b64decode(signed.signature, validate=True)
    except (binascii.Error, ValueError):
        return "the signature is not base64"
    if base64.b64encode(signature).decode("ascii") != signed.signature:
        # One spelling per signature: base64 has 16 of 64 bytes (the unused bits of the last
        # character), and a second spelling must not pass for a second signature.
        return "the signature is not in canonical base64"
    if not ed25519_verify(decode_public_key(key), statement.canonical(), signature):
        return f"the signature does not verify with approver {statement.approver!r}'s key"
    return None


def check_approval(
    signed: SignedApproval,
    *,
    approvers: Mapping[str, str],
    turn_id: str,
    tool_call_id: str,
    arguments: Mapping[str, Any],
    now: datetime,
    used: Collection[str] = (),
    run_id: str | None = None,
) -> str | None:
    """Check a signed approval against the call it answers; the reason it fails, or ``None``.

    The signature is checked first, so a statement altered after signing reads as forged
    rather than as whatever field was changed.

    Args:
        signed: the approval as it arrived.
        approvers: the deployment's approvers, name to base64 public key.
        turn_id: the turn whose call waits.
        tool_call_id: the call that waits.
        arguments: the arguments the call runs with if approved.
        now: the current time (workflow time inside a workflow).
        used: ``signature_fingerprint``s of the signatures this turn already took up (a
            second use is a replay).
        run_id: the Temporal run the call waits in; a statement that names another run is
            refused (``None``: not checked).
    """
    statement = signed.statement
    forged = signature_problem(signed, approvers)
    if forged is not None:
        return forged
    if statement.turn_id != turn_id:
        return f"the approval is for turn {statement.turn_id!r}, not {turn_id!r}"
    if statement.run_id is not None and run_id is not None and statement.run_id != run_id:
        return f"the approval is for run {statement.run_id!r} of the turn, not {run_id!r}"
    if statement.tool_call_id != tool_call_id:
        return f"the approval is for call {statement.tool_call_id!r}, not {tool_call_id!r}"
    try:
        digest = arguments_digest(arguments)
    except ValueError:
        digest = ""
    if statement.arguments_sha256 != digest:
        return "the approval is for other arguments than the call's"
    if now >= statement.expires_at:
        expired = statement.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"the approval expired at {expired}"
    if signature_fingerprint(signed.signature) in used:
        return "this signed approval was already used"
    return None


# -- RFC 8032 Ed25519 verification (section 6's reference code, verify only) -----------------

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)

_Point = tuple[int, int, int, int]  # extended homogeneous coordinates (X, Y, Z, T)


def _add(p: _Point, q: _Point) -> _Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _mul(scalar: int, point: _Point) -> _Point:
    result: _Point = (0, 1, 1, 0)
    while scalar > 0:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _equal(p: _Point, q: _Point) -> bool:
    return (p[0] * q[2] - q[0] * p[2]) % _P == 0 and (p[1] * q[2] - q[1] * p[2]) % _P == 0


def _recover_x(y: int, sign: int) -> int | None:
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P != 0:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P != 0:
        return None
    if (x & 1) != sign:
        x = _P - x
    return x


def _decompress(data: bytes) -> _Point | None:
    y = int.from_bytes(data, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = _recover_x(y, sign)
    if x is None:
        return None
    return (x, y, 1, x * y % _P)


_GY = 4 * pow(5, _P - 2, _P) % _P
_GX = _recover_x(_GY, 0)
assert _GX is not None
_BASE: _Point = (_GX, _GY, 1, _GX * _GY % _P)


def ed25519_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s Ed25519 signature of ``message`` (RFC 8032).

    Non-canonical scalars (``S >= L``) and invalid point encodings are rejected.
    """
    if len(public_key) != 32 or len(signature) != 64:
        return False
    a = _decompress(public_key)
    r_bytes = signature[:32]
    r = _decompress(r_bytes)
    if a is None or r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= _L:
        return False
    h = int.from_bytes(hashlib.sha512(r_bytes + public_key + message).digest(), "little") % _L
    return _equal(_mul(s, _BASE), _add(r, _mul(h, a)))
