"""Signed approvals on a real Temporal server: bound to an approver, the call, its exact
arguments and a deadline; anything else is refused by the Update's validator, recorded, and
the call keeps waiting (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

from tests.conftest import StackFactory
from tests.support.cli_runner import error_lines, run_cli
from tooltrail import (
    AlwaysRecoverable,
    ApprovalRejected,
    ConfigurationError,
    FixedDelay,
    Host,
    RunConfig,
    ToolCall,
    tool,
)
from tooltrail.core.hooks import Ask, PreToolUseContext
from tooltrail.core.signatures import ApprovalStatement, arguments_digest
from tooltrail.core.wire import ApprovalInput
from tooltrail.ops.approver_keys import (
    generate_approver_key,
    public_key_text,
    sign_statement,
    write_approver_key,
)
from tooltrail.ops.verify import verify_turn
from tooltrail.settings import Settings

paid: list[dict[str, Any]] = []


@tool
def pay(to: str, amount: float) -> str:
    """Move money."""
    paid.append({"to": to, "amount": amount})
    return f"paid {amount} to {to}"


class AskEveryTime:
    async def pre_tool(self, ctx: PreToolUseContext) -> Ask:
        return Ask(f"pay {ctx.input.get('amount')}?")


ALICE = generate_approver_key()
MALLORY = generate_approver_key()
APPROVERS = {"alice": public_key_text(ALICE)}
INTERACTIVE = RunConfig(interactive=True, approval_timeout_s=120)


@pytest.fixture(autouse=True)
def reset() -> None:
    paid.clear()


async def wait_parked(handle: Any, call_id: str) -> None:
    for _ in range(600):
        try:
            pending = await handle.pending_approvals()
        except (RPCError, WorkflowQueryFailedError):
            pending = []  # before the first workflow task, on a loaded machine
        if any(p.tool_call_id == call_id for p in pending):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{call_id} never parked")


def signed_for(call_id: str, arguments: dict[str, Any], turn_id: str, **changes: Any) -> Any:
    fields: dict[str, Any] = {
        "approver": "alice",
        "turn_id": turn_id,
        "tool_call_id": call_id,
        "arguments_sha256": arguments_digest(arguments),
        "decision": "approve",
        "expires_at": datetime.now(UTC) + timedelta(minutes=5),
    }
    key = changes.pop("key", ALICE)
    fields.update(changes)
    return sign_statement(ApprovalStatement.model_validate(fields), key)


async def test_only_a_valid_signature_for_these_arguments_runs_the_call(
    stack: StackFactory, db_url: str
) -> None:
    c1 = {"to": "acct-1", "amount": 10.0}
    c2 = {"to": "acct-2", "amount": 20.0}
    host = Host([pay], hooks=[AskEveryTime()], approvers=APPROVERS)
    async with stack(host, database_url=db_url) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", c1), ToolCall("c2", "pay", c2)],
            session_id="s",
            config=INTERACTIVE,
        )
        turn_id = handle.turn_id
        await wait_parked(handle, "c1")
        refused = {
            "unsigned": (
                handle.approve("c1", by="alice"),
                "approval rejected: this deployment accepts only signed approvals",
            ),
            "forged": (
                handle.approve("c1", by="alice", key=MALLORY),
                "the signature does not verify with approver 'alice''s key",
            ),
            "unknown approver": (
                handle.approve("c1", by="mallory", key=MALLORY),
                "unknown approver 'mallory'",
            ),
            "wrong digest": (
                handle.approve("c1", by="alice", key=ALICE, arguments={**c1, "amount": 1e6}),
                "the approval is for other arguments than the call's",
            ),
            "expired": (
                handle.approve("c1", by="alice", key=ALICE, expires_in=timedelta(seconds=-5)),
                "the approval expired at",
            ),
            "other turn": (
                handle.submit_approval(
                    ApprovalInput(
                        tool_call_id="c1",
                        approved=True,
                        signed=signed_for("c1", c1, "another-turn"),
                    )
                ),
                "the approval is for turn 'another-turn'",
            ),
            "decision swapped": (
                handle.submit_approval(
                    ApprovalInput(
                        tool_call_id="c1",
                        approved=True,
                        signed=signed_for("c1", c1, turn_id, decision="deny", reason="no"),
                    )
                ),
                "the signed decision is 'deny'",
            ),
        }
        for name, (attempt, text) in refused.items():
            with pytest.raises(ApprovalRejected, match=text):
                await attempt
            assert paid == [], name
        [pending] = await handle.pending_approvals()
        assert (pending.tool_call_id, pending.arguments_sha256) == ("c1", arguments_digest(c1))

        good = signed_for("c1", c1, turn_id)
        await handle.submit_approval(ApprovalInput(tool_call_id="c1", approved=True, signed=good))
        await wait_parked(handle, "c2")
        assert paid == [c1]
        # The same signed approval, replayed onto the next call: refused.
        with pytest.raises(ApprovalRejected, match="the approval is for call 'c1', not 'c2'"):
            await handle.submit_approval(
                ApprovalInput(tool_call_id="c2", approved=True, signed=good)
            )
        await handle.deny("c2", "over the limit", by="alice", key=ALICE)
        turn = await handle.result()
        events = await tt.audit(turn_id)
        rejections = await handle.approval_rejections()
        # audit verify re-checks the recorded signatures against the approvers configured.
        assert (await tt.verify(turn_id)).ok
        rotated = {"alice": public_key_text(MALLORY)}
        report = await verify_turn(tt.client, tt.store, turn_id, approvers=rotated)
        assert [(p.kind, p.tool_call_id) for p in report.problems] == [
            ("signature_invalid", "c1"),
            ("signature_invalid", "c2"),
        ]
        assert "does not verify with approver 'alice'" in report.problems[0].detail

    assert paid == [c1]
    assert [r.output for r in turn.results] == ["paid 10.0 to acct-1", "over the limit"]
    decisions = [e.payload for e in events if e.kind == "hook_decision"]
    assert [(d["outcome"], d["by"]) for d in decisions] == [
        ("approved", "alice"),
        ("denied", "alice"),
    ]
    assert decisions[0]["signed"]["signature"] == good.signature
    assert decisions[0]["signed"]["statement"]["arguments_sha256"] == arguments_digest(c1)
    assert decisions[1]["signed"]["statement"]["reason"] == "over the limit"
    assert [(r.tool_call_id, r.reason.split(": ", 1)[1][:24]) for r in rejections] == [
        ("c1", "this deployment accepts "),
        ("c1", "the signature does not v"),
        ("c1", "unknown approver 'mallor"),
        ("c1", "the approval is for othe"),
        ("c1", "the approval expired at "),
        ("c1", "the approval is for turn"),
        ("c1", "the signed decision is '"),
        ("c2", "the approval is for call"),
    ]
    assert rejections[1].approver == "alice" and rejections[2].approver == "mallory"


async def test_a_refusal_with_hostile_texts_is_recorded_on_every_database(
    stack: StackFactory, db_url: str
) -> None:
    host = Host([pay], hooks=[AskEveryTime()], approvers=APPROVERS)
    async with stack(host, database_url=db_url) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", {"to": "x", "amount": 1.0})],
            session_id="s",
            config=RunConfig(interactive=True, approval_timeout_s=1),
        )
        await wait_parked(handle, "c1")
        hostile = "a\x00b" + "é" * 5000
        with pytest.raises(ApprovalRejected, match="accepts only signed"):
            await handle.deny("c1", hostile, by=hostile)
        with pytest.raises(ApprovalRejected, match="unknown approver"):
            await handle.approve("c1", by=hostile, key=MALLORY)
        turn = await handle.result()  # nobody answered in time: the headless refusal
        rejections = await handle.approval_rejections()
    assert paid == [] and turn.results[0].is_error
    assert [r.approver for r in rejections] == ["a\\x00b" + "é" * 5000] * 2


async def test_without_approvers_by_is_a_claim_and_a_key_needs_a_name(
    stack: StackFactory,
) -> None:
    async with stack(Host([pay], hooks=[AskEveryTime()], approvers={})) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", {"to": "x", "amount": 1.0})],
            session_id="s",
            config=INTERACTIVE,
        )
        await wait_parked(handle, "c1")
        with pytest.raises(ConfigurationError, match="needs the approver's name"):
            await handle.approve("c1", key=ALICE)
        await handle.approve("c1", by="anyone at all")
        turn = await handle.result()
        events = await tt.audit(turn.turn_id)
    assert turn.results[0].output == "paid 1.0 to x"
    decision = next(e.payload for e in events if e.kind == "hook_decision")
    assert decision["by"] == "anyone at all" and "signed" not in decision


def test_approvers_come_from_wiring_or_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bob = public_key_text(MALLORY)
    listing = tmp_path / "approvers"
    listing.write_text(f"# the on-call rota\nbob:{bob}\n")
    monkeypatch.setenv("TOOLTRAIL_APPROVERS", f"alice:{APPROVERS['alice']}")
    monkeypatch.setenv("TOOLTRAIL_APPROVERS_FILE", str(listing))
    assert Host().approver_keys() == {"alice": APPROVERS["alice"], "bob": bob}
    assert Host(approvers={}).approver_keys() == {}
    assert Host(approvers={"carol": bob}).approver_keys() == {"carol": bob}
    with pytest.raises(ConfigurationError, match="approver 'carol'"):
        Host(approvers={"carol": base64.b64encode(b"short").decode()})
    listing.write_text(f"alice:{bob}\n")
    with pytest.raises(ConfigurationError, match="configured twice"):
        Settings().approver_keys()
    monkeypatch.setenv("TOOLTRAIL_APPROVERS", "alice")
    with pytest.raises(ConfigurationError, match="TOOLTRAIL_APPROVERS: approver entry"):
        Settings().approver_keys()
    write_approver_key(ALICE, tmp_path / "alice.key")


# -- the command line ---------------------------------------------------------------------


async def cli(
    args: list[str], tmp_path: Path, *, input: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``tooltrail`` in a thread, so the worker of this process keeps working."""
    return await asyncio.to_thread(run_cli, args, tmp_path, input=input, **env)


def one_error(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = error_lines(done.stderr)
    assert text in line, line


async def test_cli_keygen_signed_approve_and_history(
    stack: StackFactory, temporal_env: Any, sqlite_url: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "ops.key"
    made = await cli(["approvers", "keygen", "ops", "--out", str(key_file), "--json"], tmp_path)
    assert made.returncode == 0, made.stderr
    public = json.loads(made.stdout)["public_key"]
    again = await cli(["approvers", "keygen", "ops", "--out", str(key_file)], tmp_path)
    one_error(again, "is never overwritten")
    address = ["--temporal-address", str(temporal_env.client.service_client.config.target_host)]
    db = ["--database-url", sqlite_url]
    host = Host([pay], hooks=[AskEveryTime()], approvers={"ops": public})
    async with stack(host) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", {"to": "x", "amount": 3.0})],
            session_id="s",
            config=INTERACTIVE,
        )
        turn_id = handle.turn_id
        await wait_parked(handle, "c1")
        unsigned = await cli(["approve", turn_id, "c1", "--by", "ops", *address, *db], tmp_path)
        one_error(unsigned, "accepts only signed approvals (tooltrail approve --key FILE)")
        assert "keeps waiting" in unsigned.stderr
        stranger = generate_approver_key()
        write_approver_key(stranger, tmp_path / "stranger.key")
        stranger_args = ["approve", turn_id, "c1", "--key", str(tmp_path / "stranger.key")]
        stranger_args += ["--by", "ops", "--yes"]
        forged = await cli(
            [*stranger_args, *address, *db],
            tmp_path,
        )
        one_error(forged, "the signature does not verify with approver 'ops''s key")
        assert paid == []
        # `approvals` lists what an approval would let run: the arguments.
        listed = await cli(["approvals", turn_id, *address, *db], tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert "arguments" in listed.stdout and '"amount"' in listed.stdout
        # The approver is shown what the signature approves, and asked; "no" signs nothing.
        declined = await cli(
            ["approve", turn_id, "c1", *address, *db],
            tmp_path,
            input="n\n",
            TOOLTRAIL_APPROVER_KEY=str(key_file),
            TOOLTRAIL_APPROVER_NAME="ops",
        )
        one_error(declined, "not signed: call 'c1' keeps waiting")
        assert '"amount": 3.0' in declined.stdout and '"to": "x"' in declined.stdout
        assert paid == []
        signed = await cli(
            ["approve", turn_id, "c1", *address, *db],
            tmp_path,
            input="y\n",
            TOOLTRAIL_APPROVER_KEY=str(key_file),
            TOOLTRAIL_APPROVER_NAME="ops",
        )
        assert signed.returncode == 0, signed.stderr
        assert '"amount": 3.0' in signed.stdout
        assert "(signed by ops)" in signed.stdout
        await handle.result()
    assert paid == [{"to": "x", "amount": 3.0}]

    history = await cli(
        ["approvals", "history", turn_id, "--json", *db],
        tmp_path,
        TOOLTRAIL_APPROVERS=f"ops:{public}",
    )
    assert history.returncode == 0, history.stderr
    records = json.loads(history.stdout)
    assert [(r["outcome"], r["by"], r["signed"], r["verifies"]) for r in records] == [
        ("rejected", "ops", False, None),
        ("rejected", "ops", True, False),
        ("approved", "ops", True, True),
    ]
    # The key taken out of the list (rotated, revoked): the signature no longer verifies.
    rotated = f"ops:{public_key_text(generate_approver_key())}"
    table = await cli(["approvals", "history", turn_id, *db], tmp_path, TOOLTRAIL_APPROVERS=rotated)
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("DOES NOT VERIFY") == 2 and "unsigned" in table.stdout
    missing = await cli(["approvals", "history", "turn-nope", *db], tmp_path)
    one_error(missing, "no such turn 'turn-nope'")


# -- an ask's own deadline ------------------------------------------------------------------


class AskBriefly:
    def __init__(self, expires_in: Any) -> None:
        self.expires_in = expires_in

    async def pre_tool(self, ctx: PreToolUseContext) -> Ask:
        return Ask("pay?", expires_in=self.expires_in)


async def test_an_expired_ask_is_a_denial_with_a_reason(stack: StackFactory) -> None:
    host = Host([pay], hooks=[AskBriefly(timedelta(milliseconds=1500))], approvers=APPROVERS)
    async with stack(host) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", {"to": "x", "amount": 1.0})],
            session_id="s",
            config=INTERACTIVE,
        )
        await wait_parked(handle, "c1")
        [pending] = await handle.pending_approvals()
        assert pending.deadline is not None and pending.asked_at is not None
        assert (pending.deadline - pending.asked_at).total_seconds() == 1.5
        turn = await handle.result()
        with pytest.raises(RPCError, match="completed"):  # too late: the turn has ended
            await handle.approve("c1", by="alice", key=ALICE, arguments={"to": "x", "amount": 1})
        events = await tt.audit(turn.turn_id)
        history = await tt.approval_history(turn.turn_id)
    expected = "Approval expired: nobody answered (pay?) within 1.5s"
    assert (turn.results[0].output, turn.results[0].is_error) == (expected, True)
    assert paid == []
    decision = next(e.payload for e in events if e.kind == "hook_decision")
    assert (decision["outcome"], decision["reason"]) == ("expired", expected)
    assert [(r.outcome, r.signed) for r in history] == [("expired", False)]


async def test_the_turns_approval_timeout_still_wins_when_it_is_shorter(
    stack: StackFactory,
) -> None:
    host = Host([pay], hooks=[AskBriefly(3600)])
    config = RunConfig(interactive=True, approval_timeout_s=0.5)
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", "pay", {"to": "x", "amount": 1.0})], session_id="s", config=config
        )
    assert turn.results[0].output == (
        "Hook requested confirmation (pay?) but the session is not interactive"
    )


def test_an_ask_deadline_must_be_positive() -> None:
    assert Ask("ok?", expires_in=timedelta(minutes=2)).expires_in == 120
    assert Ask("ok?").expires_in is None
    with pytest.raises(ValueError, match="greater than 0"):
        Ask("ok?", expires_in=0)


attempts: list[int] = []


@tool
def flaky_pay(to: str) -> str:
    """Fail the first time, then pay."""
    attempts.append(len(attempts))
    if len(attempts) == 1:
        raise RuntimeError("bank timeout")
    return f"paid {to}"


async def test_a_signed_approval_is_good_for_one_attempt_only(stack: StackFactory) -> None:
    attempts.clear()
    host = Host(
        [flaky_pay], hooks=[AskEveryTime()], approvers=APPROVERS, reflector=AlwaysRecoverable()
    )
    config = RunConfig(interactive=True, approval_timeout_s=120, recovery=FixedDelay(1, 0))
    async with stack(host) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "flaky_pay", {"to": "x"})], session_id="s", config=config
        )
        await wait_parked(handle, "c1")
        good = signed_for("c1", {"to": "x"}, handle.turn_id)
        await handle.submit_approval(ApprovalInput(tool_call_id="c1", approved=True, signed=good))
        # The retry asks again: the same signature, sent again, is a replay.
        for _ in range(600):
            if attempts:
                break
            await asyncio.sleep(0.05)
        await wait_parked(handle, "c1")
        with pytest.raises(ApprovalRejected, match="this signed approval was already used"):
            await handle.submit_approval(
                ApprovalInput(tool_call_id="c1", approved=True, signed=good)
            )
        assert attempts == [0]
        await handle.approve("c1", by="alice", key=ALICE)
        turn = await handle.result()
    assert attempts == [0, 1] and turn.results[0].output == "paid x"
