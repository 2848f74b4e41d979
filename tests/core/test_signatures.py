"""Signed approvals, the pure part: canonical bytes, Ed25519 verification, the call binding."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tooltrail.core.proofs import signature_fingerprint
from tooltrail.core.signatures import (
    ApprovalStatement,
    SignedApproval,
    arguments_digest,
    check_approval,
    ed25519_verify,
    parse_approvers,
)
from tooltrail.errors import ConfigurationError
from tooltrail.ops.approver_keys import (
    generate_approver_key,
    load_approver_key,
    public_key_text,
    sign_statement,
    write_approver_key,
)

NOW = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
ARGS = {"to": "acct-9", "amount": 120.5, "memo": "café"}
ALICE = generate_approver_key()
MALLORY = generate_approver_key()
APPROVERS = {"alice": public_key_text(ALICE)}


def statement(**changes: object) -> ApprovalStatement:
    fields: dict[str, object] = {
        "approver": "alice",
        "turn_id": "t1",
        "tool_call_id": "c1",
        "arguments_sha256": arguments_digest(ARGS),
        "decision": "approve",
        "expires_at": NOW + timedelta(minutes=5),
    }
    fields.update(changes)
    return ApprovalStatement.model_validate(fields)


def check(signed: SignedApproval, **changes: object) -> str | None:
    kwargs: dict[str, object] = {
        "approvers": APPROVERS,
        "turn_id": "t1",
        "tool_call_id": "c1",
        "arguments": ARGS,
        "now": NOW,
    }
    kwargs.update(changes)
    return check_approval(signed, **kwargs)  # type: ignore[arg-type]


# RFC 8032 section 7.1, test 2 (one-byte message) and test 3 (two bytes).
RFC_VECTORS = [
    (
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    (
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
        "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
]


@pytest.mark.parametrize(("public", "message", "signature"), RFC_VECTORS)
def test_rfc8032_vectors_verify_and_any_flipped_bit_does_not(
    public: str, message: str, signature: str
) -> None:
    key, msg, sig = bytes.fromhex(public), bytes.fromhex(message), bytes.fromhex(signature)
    assert ed25519_verify(key, msg, sig)
    assert not ed25519_verify(key, msg + b"\x00", sig)
    for index in (0, 31, 32, 63):
        bent = bytearray(sig)
        bent[index] ^= 0x01
        assert not ed25519_verify(key, msg, bytes(bent))


def test_pure_verification_agrees_with_cryptography() -> None:
    for size in (0, 1, 64, 1000):
        message = bytes(range(256)) * 4
        message = message[:size]
        signature = ALICE.sign(message)
        raw = base64.b64decode(APPROVERS["alice"])
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, message)  # raises if not
        assert ed25519_verify(raw, message, signature)
        assert not ed25519_verify(base64.b64decode(public_key_text(MALLORY)), message, signature)


def test_non_canonical_scalar_and_bad_lengths_are_refused() -> None:
    raw = base64.b64decode(APPROVERS["alice"])
    signature = ALICE.sign(b"m")
    s = int.from_bytes(signature[32:], "little")
    order = 2**252 + 27742317777372353535851937790883648493
    malleable = signature[:32] + (s + order).to_bytes(32, "little")
    assert not ed25519_verify(raw, b"m", malleable)
    assert not ed25519_verify(raw, b"m", signature[:63])
    assert not ed25519_verify(raw[:31], b"m", signature)


def test_a_signed_approval_for_the_call_is_accepted() -> None:
    signed = sign_statement(statement(), ALICE)
    assert check(signed) is None
    # Key order and the JSON round trip of the Update do not change the digest.
    reordered = dict(reversed(list(ARGS.items())))
    assert (
        check(SignedApproval.model_validate_json(signed.model_dump_json()), arguments=reordered)
        is None
    )


def test_forged_signature() -> None:
    signed = sign_statement(statement(), MALLORY)  # Mallory signs in Alice's name
    assert check(signed) == "the signature does not verify with approver 'alice''s key"
    altered = sign_statement(statement(), ALICE).model_copy(deep=True)
    altered.statement.expires_at = NOW + timedelta(days=365)  # edited after signing
    assert check(altered) == "the signature does not verify with approver 'alice''s key"
    garbage = SignedApproval(statement=statement(), signature="not base64!")
    assert check(garbage) == "the signature is not base64"


def test_wrong_digest() -> None:
    signed = sign_statement(statement(), ALICE)
    other = {**ARGS, "amount": 99999}
    assert check(signed, arguments=other) == "the approval is for other arguments than the call's"


def test_expired() -> None:
    signed = sign_statement(statement(expires_at=NOW), ALICE)
    assert check(signed) == "the approval expired at 2026-12-02T06:00:00Z"
    assert check(signed, now=NOW - timedelta(seconds=1)) is None


def test_unknown_approver() -> None:
    signed = sign_statement(statement(approver="mallory"), MALLORY)
    assert check(signed) == "unknown approver 'mallory'"
    assert check(sign_statement(statement(), ALICE), approvers={}) == "unknown approver 'alice'"


def test_replay_onto_another_call_another_turn_or_twice() -> None:
    signed = sign_statement(statement(), ALICE)
    assert check(signed, tool_call_id="c2") == "the approval is for call 'c1', not 'c2'"
    assert check(signed, turn_id="t2") == "the approval is for turn 't1', not 't2'"
    used = {signature_fingerprint(signed.signature)}
    assert check(signed, used=used) == "this signed approval was already used"


def test_one_signature_has_one_spelling() -> None:
    """The 16 base64 spellings of a 64-byte signature are one signature, and only the
    canonical one is accepted (a "used" set keyed by text would count each once)."""
    signed = sign_statement(statement(), ALICE)
    raw = base64.b64decode(signed.signature)
    last = signed.signature[-3]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    base = alphabet.index(last) & ~0b1111
    spellings = [signed.signature[:-3] + alphabet[base + low] + "==" for low in range(16)]
    assert all(base64.b64decode(text) == raw for text in spellings)
    assert {signature_fingerprint(text) for text in spellings} == {
        signature_fingerprint(signed.signature)
    }
    refused = [text for text in spellings if text != signed.signature]
    assert len(refused) == 15
    for text in refused:
        other = SignedApproval(statement=signed.statement, signature=text)
        assert check(other) == "the signature is not in canonical base64"


def test_a_statement_that_names_a_run_holds_only_there() -> None:
    signed = sign_statement(statement(run_id="run-1"), ALICE)
    assert check(signed, run_id="run-1") is None
    assert check(signed, run_id="run-2") == (
        "the approval is for run 'run-1' of the turn, not 'run-2'"
    )
    # The run is signed: a statement whose run was changed afterwards reads as forged.
    moved = SignedApproval(
        statement=signed.statement.model_copy(update={"run_id": "run-2"}),
        signature=signed.signature,
    )
    assert check(moved, run_id="run-2") == (
        "the signature does not verify with approver 'alice''s key"
    )


def test_a_denials_reason_is_signed() -> None:
    signed = sign_statement(statement(decision="deny", reason="not this month"), ALICE)
    assert check(signed) is None
    signed.statement.reason = "approved after all"
    assert check(signed) is not None


def test_expiry_is_whole_utc_seconds_whatever_the_zone() -> None:
    zoned = statement(expires_at=datetime(2026, 12, 2, 8, 0, 0, 999, tzinfo=UTC).astimezone())
    assert zoned.expires_at == datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="time zone"):
        statement(expires_at=datetime(2026, 12, 2, 8, 0))


def test_approvers_list_parses_and_refuses_bad_entries() -> None:
    key = APPROVERS["alice"]
    other = public_key_text(MALLORY)
    assert parse_approvers(f"alice:{key}, bob:{other}") == {"alice": key, "bob": other}
    assert parse_approvers(f"# ops\nalice:{key}\n\nbob:{other}  # on call\n") == {
        "alice": key,
        "bob": other,
    }
    with pytest.raises(ValueError, match="not 'name:base64key'"):
        parse_approvers(key)
    with pytest.raises(ValueError, match="listed twice"):
        parse_approvers(f"alice:{key},alice:{other}")
    with pytest.raises(ValueError, match="32 bytes"):
        parse_approvers("alice:" + base64.b64encode(b"short").decode())
    with pytest.raises(ValueError, match="base64"):
        parse_approvers("alice:%%%")


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "alice.key"
    write_approver_key(ALICE, path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert public_key_text(load_approver_key(path)) == APPROVERS["alice"]
    with pytest.raises(FileExistsError):
        write_approver_key(MALLORY, path)
    (tmp_path / "junk.key").write_text("nope")
    with pytest.raises(ConfigurationError, match="not a usable PEM"):
        load_approver_key(tmp_path / "junk.key")
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_approver_key(tmp_path / "missing.key")
