"""Worker-key proofs: bound to every field, checkable across a key rotation."""

from __future__ import annotations

import base64
import os

import pytest

from tooltrail.core.proofs import (
    approval_proof,
    check_approval_proof,
    signature_fingerprint,
)
from tooltrail.errors import ConfigurationError
from tooltrail.settings import Settings

OLD = os.urandom(32)
NEW = os.urandom(32)
FIELDS = {"workflow_id": "t1", "run_id": "r1", "tool_call_id": "c1", "arguments_sha256": "ab"}


def text(keys: dict[str, bytes]) -> str:
    return ",".join(f"{kid}:{base64.b64encode(key).decode()}" for kid, key in keys.items())


def test_a_proof_holds_for_exactly_its_run_call_and_arguments() -> None:
    keys = {"k1": OLD}
    proof = approval_proof(keys, **FIELDS)
    assert check_approval_proof(keys, proof, **FIELDS)
    for name in FIELDS:
        other = {**FIELDS, name: FIELDS[name] + "x"}
        assert not check_approval_proof(keys, proof, **other), name
    # No two different field tuples share bytes: ("t1r", "1") is not ("t1", "r1").
    shifted = {**FIELDS, "workflow_id": "t1r", "run_id": "1"}
    assert not check_approval_proof(keys, proof, **shifted)
    assert not check_approval_proof({"k1": NEW}, proof, **FIELDS)
    assert not check_approval_proof(keys, "", **FIELDS)
    assert not check_approval_proof(keys, "k2." + proof.partition(".")[2], **FIELDS)


def test_rotation_without_downtime() -> None:
    """Old key first; new key listed second everywhere; new first; old dropped."""
    before = approval_proof({"old": OLD}, **FIELDS)
    during = {"new": NEW, "old": OLD}
    assert check_approval_proof({"old": OLD, "new": NEW}, before, **FIELDS)
    assert check_approval_proof(during, before, **FIELDS)
    after = approval_proof(during, **FIELDS)
    assert after.startswith("new.")
    assert check_approval_proof({"old": OLD, "new": NEW}, after, **FIELDS)
    assert not check_approval_proof({"new": NEW}, before, **FIELDS)


def test_the_settings_parse_keys_and_name_no_material() -> None:
    ring = Settings(worker_key=text({"b": NEW, "a": OLD})).worker_key_ring()
    assert list(ring) == ["b", "a"] and ring["b"] == NEW
    short = base64.b64encode(b"x" * 16).decode()
    with pytest.raises(ValueError, match="decodes to 16 bytes; at least 32") as raised:
        Settings(worker_key=f"k:{short}")
    assert short not in str(raised.value)
    assert Settings(worker_key=None).worker_key_ring() == {}
    assert "k1" not in Settings(worker_key=text({"k1": OLD})).masked().get("worker_key", "")


def test_the_key_file(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    path = tmp_path / "worker.key"
    path.write_text(text({"f": OLD}) + "\n")
    assert Settings(worker_key=None, worker_key_file=path).worker_key_ring() == {"f": OLD}
    with pytest.raises(ConfigurationError, match="cannot read the worker key file"):
        Settings(worker_key=None, worker_key_file=tmp_path / "missing").worker_key_ring()


def test_a_signature_is_its_bytes() -> None:
    raw = os.urandom(64)
    standard = base64.b64encode(raw).decode()
    urlsafe = base64.urlsafe_b64encode(raw).decode()
    assert signature_fingerprint(standard) == signature_fingerprint(urlsafe)
    assert signature_fingerprint("not base64!") is None
