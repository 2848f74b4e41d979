"""The calls that wait for a human: ``approve``, ``deny``, ``approvals``, ``approvers keygen``.

``approvals history TURN`` shows every decision on a turn's asks; ``approve`` and ``deny``
sign with an approver's key, which ``approvers keygen`` makes.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.cli._shared import (
    CommandError,
    app,
    approvers_app,
    console,
    resolve_database_url,
    rpc_error_text,
    run_command,
    temporal_client,
    with_store,
)
from tooltrail.cli.options import AddressOption, DatabaseOption, JsonOption
from tooltrail.cli.render import preview, print_json, print_table, print_text, safe_text
from tooltrail.errors import ConfigurationError
from tooltrail.settings import Settings

__all__ = ["approvals", "approve", "approvers_keygen", "deny"]


async def _turn_handle(turn_id: str, temporal_address: str | None, store: Any = None) -> Any:
    from tooltrail.client import TurnHandle
    from tooltrail.core.wire import TurnOutput

    client = await temporal_client(temporal_address)
    return TurnHandle(client.get_workflow_handle(turn_id, result_type=TurnOutput), store)


async def _running_turn(
    turn_id: str, temporal_address: str | None, call_id: str, store: Any = None
) -> Any:
    """The handle of a turn that is still running, or the one-line error that it is not.

    Raises:
        CommandError: no such turn, or it has ended (so nothing of it waits any more).
    """
    from temporalio.client import WorkflowExecutionStatus

    handle = await _turn_handle(turn_id, temporal_address, store)
    try:
        description = await handle.workflow_handle.describe()
    except RPCError as exc:
        raise CommandError(rpc_error_text(exc, f"turn {turn_id!r}")) from exc
    if description.status != WorkflowExecutionStatus.RUNNING:
        status = description.status.name.lower() if description.status else "closed"
        raise CommandError(
            f"turn {turn_id!r} has ended ({status}): call {call_id!r} is no longer waiting "
            "for approval"
        )
    return handle


async def _answer(
    turn_id: str,
    call_id: str,
    temporal_address: str | None,
    answer: Callable[[Any], Any],
    database_url: str | None = None,
) -> None:
    from tooltrail.db.migrate import open_store
    from tooltrail.db.store import AuditStore
    from tooltrail.errors import ApprovalRejected

    # The audit database records an answer the turn refuses (a refused Update leaves no
    # history); without a migrated one the refusal is still the command's answer.
    url = resolve_database_url(database_url)
    store: AuditStore | None = None
    with contextlib.suppress(Exception):
        store = await open_store(url)
    try:
        handle = await _running_turn(turn_id, temporal_address, call_id, store)
        await answer(handle)
    except RPCError as exc:
        # The turn ended between the check and the answer.
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        raise CommandError(
            f"turn {turn_id!r} has ended: call {call_id!r} is no longer waiting for approval"
        ) from exc
    except ApprovalRejected as exc:
        if not exc.reason.startswith("approval rejected:"):
            raise CommandError(
                f"{exc} in turn {turn_id!r}; `tooltrail approvals --all` lists what waits"
            ) from exc
        raise CommandError(f"{exc} (call {call_id!r} of turn {turn_id!r} keeps waiting)") from exc
    except ConfigurationError as exc:  # the turn runs, but this call does not wait
        raise CommandError(
            f"{exc} in turn {turn_id!r}; `tooltrail approvals --all` lists what waits"
        ) from exc
    finally:
        if store is not None:
            await store.close()


KeyOption = Annotated[
    Path | None,
    typer.Option(
        "--key",
        envvar="TOOLTRAIL_APPROVER_KEY",
        help="Sign with this Ed25519 private key (PEM); needed where approvers are configured.",
    ),
]
ExpiresOption = Annotated[
    float,
    typer.Option("--expires-in", min=1, help="Seconds the signed answer stays valid."),
]


def _approver(by: str | None, key: Path | None) -> str | None:
    """Who answers: ``--by``, else (signing) ``TOOLTRAIL_APPROVER_NAME``, else ``$USER``."""
    if by:
        return by
    if key is not None and Settings().approver_name:
        return Settings().approver_name
    return os.environ.get("USER")


@app.command()
def approve(
    turn_id: Annotated[str, typer.Argument(help="The turn id.")],
    call_id: Annotated[str, typer.Argument(help="The tool call id waiting for approval.")],
    by: Annotated[
        str | None,
        typer.Option(help="Who approves: a claim unsigned, the approver's name with --key."),
    ] = None,
    key: KeyOption = None,
    expires_in: ExpiresOption = 900,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Sign without asking (the arguments are shown).")
    ] = False,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Approve a call of an interactive turn that a hook parked with Ask.

    With --key the approval is signed for this turn, its run, this call and the arguments it
    waits with, which are shown first (and confirmed, unless --yes); a turn whose workers have
    approvers configured accepts nothing else.
    """
    from datetime import timedelta

    who = _approver(by, key)
    validity = timedelta(seconds=expires_in)

    async def answer(handle: Any) -> None:
        if key is None:
            await handle.approve(call_id, by=who)
            return
        arguments = await _reviewed(handle, call_id, yes)
        await handle.approve(call_id, by=who, key=key, expires_in=validity, arguments=arguments)

    run_command(_answer(turn_id, call_id, temporal_address, answer, database_url))
    signed = f" (signed by {who})" if key is not None else ""
    print_text(console, f"approved {call_id} of {turn_id}{signed}")


@app.command()
def deny(
    turn_id: Annotated[str, typer.Argument(help="The turn id.")],
    call_id: Annotated[str, typer.Argument(help="The tool call id waiting for approval.")],
    reason: Annotated[str, typer.Option(help="Why (the model reads it).")],
    by: Annotated[
        str | None,
        typer.Option(help="Who denies: a claim unsigned, the approver's name with --key."),
    ] = None,
    key: KeyOption = None,
    expires_in: ExpiresOption = 900,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Deny a call of an interactive turn that a hook parked with Ask (--key signs it)."""
    from datetime import timedelta

    who = _approver(by, key)
    validity = timedelta(seconds=expires_in)
    run_command(
        _answer(
            turn_id,
            call_id,
            temporal_address,
            lambda h: h.deny(call_id, reason, by=who, key=key, expires_in=validity),
            database_url,
        )
    )
    signed = f" (signed by {who})" if key is not None else ""
    print_text(console, f"denied {call_id} of {turn_id}{signed}")


async def _reviewed(handle: Any, call_id: str, yes: bool) -> dict[str, Any]:
    """Show what a signature would approve and ask; the arguments it binds to.

    The signature binds the exact arguments the call waits with: the approver sees them (as
    JSON with every non-ASCII and control character escaped, so a model's text cannot hide a
    part of them from the terminal) before anything is signed.

    Raises:
        CommandError: the call does not wait, or the approver said no.
    """
    pending = {p.tool_call_id: p for p in await handle.pending_approvals()}
    waiting = pending.get(call_id)
    if waiting is None:
        names = ", ".join(sorted(pending)) or "none"
        raise CommandError(f"call {call_id!r} is not waiting for approval (waiting: {names})")
    shown = json.dumps(waiting.arguments, ensure_ascii=True, sort_keys=True, indent=2)
    print_text(console, f"tool: {json.dumps(waiting.tool_name, ensure_ascii=True)}")
    print_text(console, f"question: {json.dumps(waiting.question, ensure_ascii=True)}")
    print_text(console, f"arguments (what the signature approves):\n{shown}")
    if not yes and not typer.confirm("Sign this approval?", default=False):
        raise CommandError(f"not signed: call {call_id!r} keeps waiting")
    arguments: dict[str, Any] = waiting.arguments
    return arguments


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


@app.command()
def approvals(
    turn_id: Annotated[str | None, typer.Argument(help="The turn id (or `history`).")] = None,
    history_of: Annotated[
        str | None, typer.Argument(metavar="[TURN]", help="With `history`: the turn.")
    ] = None,
    all_turns: Annotated[
        bool,
        typer.Option(
            "--all", help="Every call waiting for approval, across running turns (oldest first)."
        ),
    ] = False,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """List the calls waiting for approval: of one turn, or of every running turn (--all).

    `tooltrail approvals history TURN` shows every decision on the turn's asks and every
    answer it refused: who decided, whether it was signed, and whether the signature still
    verifies with the approvers configured now (TOOLTRAIL_APPROVERS, TOOLTRAIL_APPROVERS_FILE).
    """
    from datetime import UTC

    from tooltrail.client import Tooltrail, WaitingApproval
    from tooltrail.pipeline.host import Host

    if history_of is not None:
        if turn_id != "history":
            raise typer.BadParameter("one TURN, or `history TURN`")
        _approval_history(history_of, database_url, json_output)
        return
    if (turn_id is None) == (not all_turns):
        raise typer.BadParameter("give a TURN, or --all (not both)")

    async def go() -> list[WaitingApproval]:
        if all_turns:
            client = await temporal_client(temporal_address)
            tt = Tooltrail(client, Host(), task_queue="", store=None)  # type: ignore[arg-type]
            return await tt.waiting_approvals()
        assert turn_id is not None
        handle = await _turn_handle(turn_id, temporal_address)
        try:
            description = await handle.workflow_handle.describe()
        except RPCError as exc:
            raise CommandError(rpc_error_text(exc, f"turn {turn_id!r}")) from exc
        if description.close_time is not None:
            return []  # an ended turn waits for nothing (and a query would need a worker)
        pending = await handle.pending_approvals()
        return [WaitingApproval(turn_id=turn_id, **p.model_dump()) for p in pending]

    pending = run_command(go())
    now = datetime.now(UTC)
    if json_output:
        print_json(
            console,
            [
                {
                    **p.model_dump(mode="json"),
                    "age_s": None if p.asked_at is None else (now - p.asked_at).total_seconds(),
                }
                for p in pending
            ],
        )
        return
    if not pending:
        console.print("nothing is waiting for approval")
        return
    from rich.table import Table

    from tooltrail.cli.render import id_column

    table = Table(title="Waiting for approval", title_justify="left")
    id_column(table, "turn")
    id_column(table, "call")
    id_column(table, "tool")
    table.add_column("waiting", justify="right", no_wrap=True)
    table.add_column("deadline", no_wrap=True)
    table.add_column("question", overflow="fold")
    table.add_column("arguments", overflow="fold")
    for item in pending:
        age = "" if item.asked_at is None else _duration((now - item.asked_at).total_seconds())
        deadline = ""
        if item.deadline is not None:
            left = (item.deadline - now).total_seconds()
            local = item.deadline.astimezone().strftime("%Y-%m-%d %H:%M:%S")
            deadline = f"{local} (in {_duration(left)})"
        table.add_row(
            safe_text(item.turn_id),
            safe_text(item.tool_call_id),
            safe_text(item.tool_name),
            age,
            deadline,
            safe_text(preview(item.question, 200)),
            # What an approval would let run: JSON, every control and non-ASCII escaped.
            safe_text(preview(json.dumps(item.arguments, ensure_ascii=True, sort_keys=True), 400)),
        )
    print_table(console, table)


def _approval_history(turn_id: str, database_url: str | None, json_output: bool) -> None:
    """Print a turn's approval history (``approvals history TURN``)."""
    from tooltrail.db.approvals import list_rejections
    from tooltrail.ops.approval_history import ApprovalRecord, approval_history

    try:
        approvers = Settings().approver_keys()
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from exc

    async def read(store: Any) -> list[ApprovalRecord]:
        turn = await store.turn(turn_id)
        rejections = await list_rejections(store, turn_id)
        if turn is None and not rejections:
            raise CommandError(f"no such turn {turn_id!r} in the audit database")
        return approval_history(await store.events(turn_id), rejections, approvers)

    records = run_command(with_store(resolve_database_url(database_url), read))
    if json_output:
        print_json(console, [r.model_dump(mode="json") for r in records])
        return
    if not records:
        console.print("no call of this turn asked for approval")
        return
    from rich.table import Table

    from tooltrail.cli.render import id_column

    # A Text title: the turn id is data, never markup.
    table = Table(title=safe_text(f"Approvals of {turn_id}"), title_justify="left")
    table.add_column("at", no_wrap=True)
    id_column(table, "call")
    table.add_column("outcome", no_wrap=True)
    table.add_column("by", overflow="fold")
    table.add_column("signature", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for record in records:
        if not record.signed:
            signature = "unsigned"
        else:
            signature = "verifies" if record.verifies else "DOES NOT VERIFY"
        detail = record.problem if record.outcome == "rejected" or not record.verifies else None
        table.add_row(
            record.at.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
            safe_text(record.tool_call_id),
            safe_text(record.outcome),
            safe_text(record.by or ""),
            signature,
            safe_text(preview(detail or record.reason or "", 200)),
        )
    print_table(console, table)


@approvers_app.command("keygen")
def approvers_keygen(
    name: Annotated[str, typer.Argument(help="The approver's name, as the workers list it.")],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="The private key file to write (mode 0600).")
    ],
    json_output: JsonOption = False,
) -> None:
    """Make an approver's Ed25519 key pair: the private key to a file, the public key shown.

    Give the printed `NAME:KEY` entry to the workers (TOOLTRAIL_APPROVERS or
    TOOLTRAIL_APPROVERS_FILE, or Host(approvers=...)); the approver signs with
    `tooltrail approve TURN CALL --key FILE --by NAME`.
    """
    from tooltrail.ops.approver_keys import (
        generate_approver_key,
        public_key_text,
        write_approver_key,
    )

    if not name or any(c in name for c in ":,#\n"):
        raise CommandError(f"an approver name has no ':', ',', '#' or newline: {name!r}")
    key = generate_approver_key()
    try:
        write_approver_key(key, out)
    except FileExistsError:
        raise CommandError(f"{out} exists; a key file is never overwritten") from None
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror}") from None
    entry = f"{name}:{public_key_text(key)}"
    if json_output:
        print_json(
            console, {"name": name, "public_key": public_key_text(key), "key_file": str(out)}
        )
        return
    console.print(safe_text(f"wrote the private key of {name!r} to {out} (keep it to yourself)"))
    print_text(console, f"approver entry for the workers: {entry}")
