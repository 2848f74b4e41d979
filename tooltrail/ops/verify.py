"""Verify a turn's audit trail against Temporal's history of the same turn. Writes nothing.

The SQL trail is written by tooltrail; the workflow history is written by the Temporal
server. ``verify`` fetches the history and checks that the trail says what it says:

- every tool activity that completed with a result (a body that ran, a shadow answer, a
  breaker refusal) has its ``tool_post`` record, for the same call and attempt;
- the output of each such record has the digest of the output Temporal returned (a large
  output's digest travels in the history; its text is read back from ``blob``);
- the turn's final status is the one Temporal closed the workflow with;
- the records' ``seq`` run 0, 1, 2, ... with no hole (a deleted record leaves one);
- the records checked are those of the run Temporal names (the latest of the workflow id),
  not of the run the turn's row names (``run_mismatch``); records under a run id Temporal
  does not know for the workflow id are a problem (``unknown_run``);
- each such record's input is the input Temporal ran the attempt with (``input_mismatch``);
- every run's hash chain holds (``tooltrail.core.chain``), and the latest run's ends at the head
  the run anchored in its history: a completed turn's result (``TurnOutput.trail_head``), a
  failed or cancelled turn's memo (``TRAIL_HEAD_MEMO``), agent runs' turns included; so a
  trail cut short at its end is caught too (``VerifyReport.anchor`` says where, or that the
  run has no anchor: running, terminated, timed out, or recorded before its anchor existed);
- every head a write of the run returned (the result of each ``tooltrail.audit.record``
  local activity, which its marker keeps in the history) is the digest of one of the run's
  records (``anchor_mismatch``): SHA-256 is unkeyed, so an edit with the chain recomputed
  holds on its own, but not against the heads Temporal kept, in the middle of a terminated
  or timed-out run as much as at the end of a completed one, and a run whose records were
  all deleted fails it too.

Problems are mismatches, except ``unknown_turn``, ``history_gone`` and ``undecodable``: the
turn cannot be checked (nothing of it anywhere; Temporal deleted its history by retention;
the history's payloads are encrypted with keys this process lacks). What verify cannot
prove: a trail consistent with a history that was rewritten too. Someone able to rewrite
both the database and Temporal's history can make them agree.

Attempts of ``@tool(local=True)`` tools: their markers hold their results but not their
inputs, so each local output's digest must be one of a ``tool_post`` no regular attempt
accounts for (``local_attempts_checked``); their inputs are not checked (``not_checked``
says so). Not checked: records missing from a turn that did not close by its own code
(running, cancelled, terminated, timed out: records produced after the last write of such a
turn are legitimately absent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, computed_field
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecution, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.core.envelopes import open_outcome
from tooltrail.core.results import Part
from tooltrail.core.text import canonical_json, render_text, stable_hash
from tooltrail.core.wire import (
    ATTEMPT_OUTCOME,
    AUDIT_RECORD,
    SESSION_MEMO,
    TOOL_EXECUTE,
    TRAIL_HEAD_MEMO,
    AuditEvent,
    BreakerRefused,
    ExecuteAttempt,
    Ran,
    ShadowServed,
    TurnInput,
    TurnOutput,
    TurnRecord,
)
from tooltrail.db.store import AuditStore
from tooltrail.ops.approval_history import approval_history
from tooltrail.pipeline.middleware import RedactingMiddleware
from tooltrail.pipeline.redaction import redact_value

__all__ = [
    "CANNOT_CHECK",
    "Problem",
    "VerifyReport",
    "temporal_turns",
    "verify_turn",
    "verify_turns",
]

CANNOT_CHECK = frozenset({"unknown_turn", "history_gone", "undecodable"})
"""Problem kinds that mean the turn could not be checked (``tooltrail audit verify`` exit 2)."""

_CLOSE_STATUS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
}
_BY_ITS_OWN_CODE = frozenset({"completed", "failed"})
"""Closes after which the turn's whole trail was written (its final write insists)."""
_OUTPUT: TypeAdapter[str | list[Part]] = TypeAdapter(str | list[Part])


class Problem(BaseModel):
    """One disagreement between the trail and the history (or why there was no check)."""

    kind: str
    """``missing_record``, ``output_mismatch``, ``input_mismatch``, ``status_mismatch``,
    ``seq_gap``, ``missing_turn_row``, ``run_mismatch``, ``unknown_run``, ``chain_broken`` (a
    run's hash chain, ``tooltrail.core.chain``), ``anchor_mismatch`` (a head Temporal kept that
    no record has), ``missing_turn`` (a turn Temporal has for the session or time range that
    the database lacks),
    ``signature_invalid`` (a signed approval that no longer verifies); or,
    when the turn cannot be checked, ``unknown_turn``, ``history_gone``, ``undecodable``."""
    detail: str
    turn_id: str
    tool_call_id: str | None = None
    attempt: int | None = None


class VerifyReport(BaseModel):
    """The verification of one turn."""

    turn_id: str
    run_id: str | None = None
    """The run of the turn's workflow id whose history was checked (the latest)."""
    temporal_status: str | None = None
    """How Temporal says the run stands (``running`` while it runs)."""
    trail_status: str | None = None
    """What the turn's row says."""
    anchor: Literal["result", "memo"] | None = None
    """Where the latest run anchored its hash chain's head in Temporal's history: its result
    (a completed turn), its memo (a failed or cancelled one); None, not anchored (a turn
    running, terminated or timed out, or recorded by a worker older than its anchor): then
    a chain cut short at its end goes unnoticed."""
    attempts_checked: int = 0
    """Completed tool activities found in the history and matched against the trail."""
    local_attempts_checked: int = 0
    """Local tool attempts (``@tool(local=True)``) whose output digest, kept in their history
    marker, was found among the trail's records."""
    not_checked: list[str] = Field(default_factory=list)
    """What the history could not prove here, in words (a local attempt's input, which its
    marker does not hold)."""
    problems: list[Problem] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """True when the trail and the history agree on everything checked."""
        return not self.problems

    @computed_field  # type: ignore[prop-decorator]
    @property
    def checkable(self) -> bool:
        """False when the turn could not be checked at all (see ``CANNOT_CHECK``)."""
        return not any(problem.kind in CANNOT_CHECK for problem in self.problems)


def output_digest(output: Any) -> str | None:
    """The digest an output's text has in the trail (``result_hash``) and the history."""
    try:
        value = _OUTPUT.validate_python(output)
    except ValueError:
        return stable_hash(str(output))
    return stable_hash(render_text(value))


class _Attempt(BaseModel):
    request: ExecuteAttempt
    compare: bool = True
    """False for a breaker refusal: only its record's presence is checked."""
    digest: str | None = None
    """The output's digest, for attempts that ran (or were served from a shadow plan)."""


async def _history(client: Client, turn_id: str) -> tuple[str, WorkflowHistory] | None:
    """The latest run of the turn's workflow id and its history; None when Temporal has none."""
    try:
        run_id = (await client.get_workflow_handle(turn_id).describe()).run_id
        history = await client.get_workflow_handle(turn_id, run_id=run_id).fetch_history()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return run_id, history


async def _write_heads(client: Client, events: list[HistoryEvent]) -> list[tuple[int, str]]:
    """The chain heads the run's audit writes returned, with their marker's event id.

    ``tooltrail.audit.record`` runs as a local activity and returns the digest of the last
    record it wrote; its marker keeps that result in the history, where the database cannot
    change it.
    """
    heads: list[tuple[int, str]] = []
    for event_id, value in await _local_results(client, events, AUDIT_RECORD, object):
        if isinstance(value, str) and value:
            heads.append((event_id, value))
    return heads


async def _local_outputs(client: Client, events: list[HistoryEvent]) -> list[str | None]:
    """The output digests of the run's local tool attempts that ran (their markers)."""
    digests: list[str | None] = []
    for _, outcome in await _local_results(client, events, TOOL_EXECUTE, ATTEMPT_OUTCOME):
        if isinstance(outcome, Ran) and outcome.output_ref is not None:
            digests.append(outcome.output_hash)
        elif isinstance(outcome, Ran | ShadowServed):
            digests.append(output_digest(outcome.output))
    return digests


async def _local_results(
    client: Client, events: list[HistoryEvent], activity_type: str, result_type: Any
) -> list[tuple[int, Any]]:
    """The results of the run's local activities of one type, with their marker's event id."""
    found: list[tuple[int, Any]] = []
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        details = event.marker_recorded_event_attributes.details
        data, result = details.get("data"), details.get("result")
        if data is None or result is None or not data.payloads or not result.payloads:
            continue
        (meta,) = await client.data_converter.decode(list(data.payloads), [dict])
        if not isinstance(meta, dict) or meta.get("activity_type") != activity_type:
            continue
        (value,) = await client.data_converter.decode(list(result.payloads), [result_type])
        found.append((event.event_id, value))
    return found


async def _completed_attempts(
    client: Client, events: list[HistoryEvent]
) -> tuple[list[_Attempt], str | None]:
    """The tool activities that completed with a result, and the close status (or None).

    Raises:
        ValueError: a payload could not be decoded (keys missing, say).
    """
    scheduled: dict[int, Any] = {}
    attempts: list[_Attempt] = []
    status: str | None = None
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == TOOL_EXECUTE:
                scheduled[event.event_id] = attrs.input
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            payloads = scheduled.get(done.scheduled_event_id)
            if payloads is None:
                continue
            [request] = await client.data_converter.decode_wrapper(payloads, [ExecuteAttempt])
            [outcome] = await client.data_converter.decode_wrapper(done.result, [ATTEMPT_OUTCOME])
            outcome = open_outcome(outcome, request)
            if isinstance(outcome, Ran) and outcome.output_ref is not None:
                attempts.append(_Attempt(request=request, digest=outcome.output_hash))
            elif isinstance(outcome, Ran | ShadowServed):
                attempts.append(_Attempt(request=request, digest=output_digest(outcome.output)))
            elif isinstance(outcome, BreakerRefused):
                attempts.append(_Attempt(request=request, compare=False))
        elif event.event_type in _CLOSE_STATUS:
            status = _CLOSE_STATUS[event.event_type]
    return attempts, status


_MAX_ID = 255
"""The ``turn`` table's id length (PostgreSQL refuses longer values where SQLite keeps them)."""


def _id_fault(value: str) -> str:
    if not value:
        return "it is empty"
    if "\x00" in value:
        return "it holds a NUL character"
    return f"it is {len(value)} characters long, more than {_MAX_ID}"


def _possible_id(value: str) -> bool:
    """Whether a turn or session id could be stored at all (asked before any query)."""
    return bool(value) and "\x00" not in value and len(value) <= _MAX_ID


def _seq_problems(turn_id: str, events: list[AuditEvent]) -> list[Problem]:
    seqs = [event.seq for event in events]
    if not seqs:
        return []
    holes = sorted(set(range(max(seqs) + 1)) - set(seqs))
    if not holes:
        return []
    shown = ", ".join(map(str, holes[:20])) + (" ..." if len(holes) > 20 else "")
    return [
        Problem(
            kind="seq_gap",
            turn_id=turn_id,
            detail=f"the trail has no record at seq {shown} (of 0..{max(seqs)})",
        )
    ]


async def verify_turn(
    client: Client,
    store: AuditStore,
    turn_id: str,
    *,
    approvers: Mapping[str, str] | None = None,
    redactors: Sequence[RedactingMiddleware] = (),
) -> VerifyReport:
    """Check one turn's trail against Temporal's history of its workflow (latest run).

    Reads only: nothing is written to the database or to Temporal.

    Args:
        client: the Temporal client (with the deployment's data converter).
        store: the audit database.
        turn_id: the turn.
        approvers: the configured approvers (name to base64 public key); when given, every
            signed approval in the trail is re-checked against them (``signature_invalid``).
        redactors: the host's ``RedactingMiddleware`` layers: the trail stores inputs
            redacted, so the history's are redacted alike before they are compared (without
            them, a redacted input reads as ``input_mismatch``).

    Raises:
        RPCError: Temporal could not answer (other than "not found").
    """
    report = VerifyReport(turn_id=turn_id)
    if not _possible_id(turn_id):
        detail = f"no turn can have this id ({_id_fault(turn_id)}): there is nothing to check"
        report.problems.append(Problem(kind="unknown_turn", turn_id=turn_id, detail=detail))
        return report
    row = await store.turn(turn_id)
    stored = await store.events(turn_id, all_runs=True)
    report.trail_status = row.status if row is not None else None
    found = await _history(client, turn_id)
    if found is None:
        if row is None and not stored:
            detail = "no such turn: neither the audit database nor Temporal has it"
            report.problems.append(Problem(kind="unknown_turn", turn_id=turn_id, detail=detail))
        else:
            detail = (
                "Temporal has no history of this turn any more (deleted by the namespace's "
                "retention, or another namespace): the trail cannot be checked"
            )
            report.problems.append(Problem(kind="history_gone", turn_id=turn_id, detail=detail))
        return report
    report.run_id, history = found
    events = list(history.events)
    first = events[0].workflow_execution_started_event_attributes if events else None
    if first is None or first.workflow_type.name != "TurnWorkflow":
        kind = first.workflow_type.name if first is not None else "empty history"
        detail = f"{turn_id!r} is a {kind} workflow, not a turn (agent runs list their turns)"
        report.problems.append(Problem(kind="unknown_turn", turn_id=turn_id, detail=detail))
        return report
    try:
        attempts, closed = await _completed_attempts(client, events)
        anchor = await _trail_head(client, events)
        written = await _write_heads(client, events)
        local = await _local_outputs(client, events)
    except Exception as exc:  # a codec without the keys, a payload of another converter
        detail = (
            f"the history's payloads cannot be decoded here ({type(exc).__name__}): give this "
            "process the deployment's codec keys (TOOLTRAIL_CODEC_KEYS)"
        )
        report.problems.append(Problem(kind="undecodable", turn_id=turn_id, detail=detail))
        return report
    report.temporal_status = closed or "running"
    head = None
    if anchor is not None:
        head, report.anchor = anchor
    # The records of the run Temporal names, whatever the turn's row says (a row pointed at
    # a made-up run would otherwise choose which records are checked); records written
    # before runs were named have no run id and stand for the run.
    trail = [e for e in stored if e.run_id == report.run_id]
    if not trail:
        trail = [e for e in stored if not e.run_id]
    report.problems.extend(await _run_problems(client, turn_id, report.run_id, row, stored))
    if row is None:
        report.problems.append(
            Problem(
                kind="missing_turn_row",
                turn_id=turn_id,
                detail="Temporal has this turn's history, the audit database has no turn row",
            )
        )
    elif row.status != report.temporal_status:
        report.problems.append(
            Problem(
                kind="status_mismatch",
                turn_id=turn_id,
                detail=(
                    f"the trail says {row.status!r}, Temporal says {report.temporal_status!r}"
                    + (
                        " (`tooltrail audit reconcile` fixes a turn left running)"
                        if row.status == "running"
                        else ""
                    )
                ),
            )
        )
    checked, problems = _attempt_problems(
        turn_id, attempts, trail, closed in _BY_ITS_OWN_CODE, redactors
    )
    report.attempts_checked = checked
    report.problems.extend(problems)
    report.problems.extend(_local_problems(report, turn_id, attempts, trail, local))
    report.problems.extend(_head_problems(turn_id, report.run_id, trail, written, head))
    report.problems.extend(_seq_problems(turn_id, trail))
    report.problems.extend(await _chain_problems(store, turn_id, report.run_id, head))
    if approvers:
        report.problems.extend(_signature_problems(turn_id, trail, approvers))
    return report


def _attempt_problems(
    turn_id: str,
    attempts: list[_Attempt],
    trail: list[AuditEvent],
    whole: bool,
    redactors: Sequence[RedactingMiddleware] = (),
) -> tuple[int, list[Problem]]:
    """Each completed attempt against its ``tool_post``: present, same input, same output.

    Args:
        turn_id: the turn.
        attempts: the history's completed tool attempts.
        trail: the run's records.
        whole: the run closed by its own code, so every record must be there.
        redactors: the host's redacting layers (the trail's inputs are stored redacted).

    Returns:
        How many attempts were checked, and the problems found.
    """
    checked = 0
    problems: list[Problem] = []
    posts = {
        (event.tool_call_id, event.attempt): event for event in trail if event.kind == "tool_post"
    }
    for attempt in attempts:
        request = attempt.request
        checked += 1
        where = f"call {request.tool_call_id!r} attempt {request.attempt}"
        post = posts.get((request.tool_call_id, request.attempt))
        if post is None:
            if whole:
                problems.append(
                    Problem(
                        kind="missing_record",
                        turn_id=turn_id,
                        tool_call_id=request.tool_call_id,
                        attempt=request.attempt,
                        detail=f"{where} completed in Temporal; the trail has no tool_post",
                    )
                )
            continue
        input_problem = _input_problem(request, post, redactors)
        if input_problem is not None:
            problems.append(
                Problem(
                    kind="input_mismatch",
                    turn_id=turn_id,
                    tool_call_id=request.tool_call_id,
                    attempt=request.attempt,
                    detail=f"{where}: {input_problem}",
                )
            )
        if not attempt.compare:
            continue  # a breaker refusal: nothing ran, its record is there
        stored_digest = output_digest(post.payload.get("output"))
        recorded = post.payload.get("result_hash")
        expected = attempt.digest
        if stored_digest != expected or recorded != expected:
            problems.append(
                Problem(
                    kind="output_mismatch",
                    turn_id=turn_id,
                    tool_call_id=request.tool_call_id,
                    attempt=request.attempt,
                    detail=(
                        f"{where}: Temporal returned an output with digest {expected}; the "
                        f"trail's output has digest {stored_digest} (recorded {recorded})"
                    ),
                )
            )
    return checked, problems


def _local_problems(
    report: VerifyReport,
    turn_id: str,
    attempts: list[_Attempt],
    trail: list[AuditEvent],
    local: list[str | None],
) -> list[Problem]:
    """Each local tool attempt's output (its marker) against the trail's other records.

    A local activity's marker holds its result but not its input (so not its call id): each
    output digest must be one of a ``tool_post`` that no regular attempt accounts for.
    """
    if not local:
        return []
    regular = {(a.request.tool_call_id, a.request.attempt) for a in attempts}
    left: dict[str | None, int] = {}
    for event in trail:
        if event.kind == "tool_post" and (event.tool_call_id, event.attempt) not in regular:
            digest = event.payload.get("result_hash")
            if output_digest(event.payload.get("output")) != digest:
                continue  # its output is not the one it says it recorded: it matches nothing
            left[digest] = left.get(digest, 0) + 1
    problems: list[Problem] = []
    for digest in local:
        if left.get(digest, 0) > 0:
            left[digest] -= 1
            report.local_attempts_checked += 1
            continue
        problems.append(
            Problem(
                kind="output_mismatch",
                turn_id=turn_id,
                detail=(
                    f"a local tool attempt returned an output with digest {digest} (its "
                    "history marker); no tool_post of the trail records it"
                ),
            )
        )
    report.not_checked.append(
        f"the inputs of {len(local)} local tool attempt(s): a local activity's marker holds "
        "its result, not its input"
    )
    return problems


def _input_problem(
    request: ExecuteAttempt, post: AuditEvent, redactors: Sequence[RedactingMiddleware]
) -> str | None:
    """How the record's call differs from the attempt Temporal ran, or ``None``.

    The trail stores inputs redacted by the host's ``RedactingMiddleware`` rules: the
    history's arguments are redacted with the same rules before they are compared.
    """
    recorded = post.payload.get("input")
    try:
        ran = canonical_json(redact_value(request.arguments, redactors))
        said = canonical_json(recorded)
    except ValueError:  # a value JSON cannot carry: compare as Python values
        ran, said = repr(request.arguments), repr(recorded)
    if ran != said:
        return (
            f"Temporal ran it with arguments of digest {stable_hash(ran)}; the trail's "
            f"tool_post records arguments of digest {stable_hash(said)}"
        )
    tool = post.payload.get("tool")
    if tool is not None and tool != request.tool_name:
        return f"Temporal ran tool {request.tool_name!r}; the trail records {tool!r}"
    return None


async def _run_problems(
    client: Client,
    turn_id: str,
    run_id: str | None,
    row: TurnRecord | None,
    stored: list[AuditEvent],
) -> list[Problem]:
    """The turn's row and records against the runs Temporal has for the workflow id."""
    problems: list[Problem] = []
    if row is not None and row.run_id and row.run_id != run_id:
        problems.append(
            Problem(
                kind="run_mismatch",
                turn_id=turn_id,
                detail=(
                    f"the turn's row names run {row.run_id!r}; Temporal's latest run of the "
                    f"turn is {run_id!r} (its records are the ones checked)"
                ),
            )
        )
    named = {e.run_id for e in stored if e.run_id and e.run_id != run_id}
    if not named:
        return problems
    known = await _known_runs(client, turn_id)
    for other in sorted(named - known):
        count = sum(1 for e in stored if e.run_id == other)
        problems.append(
            Problem(
                kind="unknown_run",
                turn_id=turn_id,
                detail=(
                    f"{count} record(s) under run {other!r}, which Temporal does not know for "
                    "this workflow id"
                ),
            )
        )
    return problems


async def _known_runs(client: Client, turn_id: str) -> set[str]:
    """Every run Temporal's visibility lists for the workflow id (open and closed)."""
    quoted = turn_id.replace("\\", "\\\\").replace("'", "\\'")
    runs: set[str] = set()
    async for execution in client.list_workflows(f"WorkflowId = '{quoted}'"):
        runs.add(execution.run_id)
    return runs


def _head_problems(
    turn_id: str,
    run_id: str | None,
    trail: list[AuditEvent],
    written: list[tuple[int, str]],
    head: str | None,
) -> list[Problem]:
    """Each head Temporal kept for the run that no record of the run has as its digest."""
    digests = {e.digest for e in trail if e.digest}
    problems: list[Problem] = []
    # The anchor itself (the last write's head, too) is the chain's check, which says how
    # the end differs (``_chain_problems``); here only when no record of the run is left.
    expected = [
        (f"the write at history event {event_id}", value)
        for event_id, value in written
        if value != head
    ]
    if head and not trail:
        expected.append(("the run's anchor", head))
    for where, value in expected:
        if value not in digests:
            problems.append(
                Problem(
                    kind="anchor_mismatch",
                    turn_id=turn_id,
                    detail=(
                        f"run {run_id}: {where} returned chain head {value[:16]}..., which no "
                        f"record of the run has ({len(trail)} record(s)): records were "
                        "edited, added or deleted after they were written"
                    ),
                )
            )
            break  # one is enough to say so; the others follow from it
    return problems


def _signature_problems(
    turn_id: str, trail: list[AuditEvent], approvers: Mapping[str, str]
) -> list[Problem]:
    """Each signed approval the trail records that does not verify with today's approvers."""
    problems: list[Problem] = []
    for record in approval_history(trail, (), approvers):
        if record.signed and not record.verifies:
            problems.append(
                Problem(
                    kind="signature_invalid",
                    turn_id=turn_id,
                    tool_call_id=record.tool_call_id,
                    detail=f"the approval signed by {record.by!r}: {record.problem}",
                )
            )
    return problems


async def _trail_head(
    client: Client, events: list[HistoryEvent]
) -> tuple[str, Literal["result", "memo"]] | None:
    """The chain head the run anchored in Temporal's history, and where; None: no anchor.

    A completed turn anchors it in its result (``TurnOutput.trail_head``); a failed or
    cancelled one, in its memo (``TRAIL_HEAD_MEMO``, upserted after its final write). Runs
    recorded before either existed have no anchor: their chain is checked on its own.
    """
    for event in reversed(events):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = event.workflow_execution_completed_event_attributes.result.payloads
            if not payloads:
                return None
            (output,) = await client.data_converter.decode(list(payloads), [TurnOutput])
            return (output.trail_head, "result") if output.trail_head else None
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
            memo = event.workflow_properties_modified_event_attributes.upserted_memo.fields
            if TRAIL_HEAD_MEMO in memo:
                (head,) = await client.data_converter.decode([memo[TRAIL_HEAD_MEMO]], [str])
                return (str(head), "memo") if head else None
    return None


async def _chain_problems(
    store: AuditStore, turn_id: str, run_id: str | None, head: str | None
) -> list[Problem]:
    """Each run's hash chain recomputed; the latest run's also against its anchor, if any.

    Records written before digests existed (no ``digest``) have no chain to check.
    """
    heads = {run_id: head} if run_id and head else {}
    found = await store.chain_problems(turn_id, heads=heads)
    problems: list[Problem] = []
    for run, texts in found.items():
        for text in texts:
            problems.append(
                Problem(kind="chain_broken", turn_id=turn_id, detail=f"run {run or '-'}: {text}")
            )
    return problems


async def verify_turns(
    client: Client,
    store: AuditStore,
    *,
    session_id: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
    approvers: Mapping[str, str] | None = None,
    redactors: Sequence[RedactingMiddleware] = (),
) -> list[VerifyReport]:
    """Verify the turns of a session, or started since a time (newest first).

    The turns are those the database lists *and* those Temporal's visibility lists
    (``temporal_turns``): a turn deleted from the database is verified all the same (and
    reported, ``missing_turn_row``) instead of skipped. A session id no turn can have
    (empty, with a NUL, too long) matches no turn.
    """
    if session_id is not None and not _possible_id(session_id):
        return []
    turns = await store.turns(session_id=session_id, since=since, limit=limit)
    ids = [turn.turn_id for turn in turns]
    for turn_id in await temporal_turns(client, session_id=session_id, since=since, limit=limit):
        if turn_id not in ids:
            ids.append(turn_id)
    return [
        await verify_turn(client, store, turn_id, approvers=approvers, redactors=redactors)
        for turn_id in ids[:limit]
    ]


async def temporal_turns(
    client: Client,
    *,
    session_id: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
) -> list[str]:
    """The turns Temporal has (visibility), newest first: of a session, started since a time.

    Visibility cannot filter on the session (it is in the turn's input, not a search
    attribute), so each candidate's first history event is read for it; ``since`` narrows
    the candidates on the server; turns started by ``Tooltrail.start_turn`` name their session
    in their memo (``SESSION_MEMO``), read from the listing itself. A turn whose session cannot
    be read here (its input encrypted with keys this process lacks) is not attributed to the
    session: other tenants' turns of a shared namespace would otherwise all be listed.
    """
    query = "WorkflowType = 'TurnWorkflow'"
    if since is not None:
        moment = since.astimezone(UTC) if since.tzinfo else since.replace(tzinfo=UTC)
        query += f" AND StartTime >= '{moment.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"
    seen: set[str] = set()
    found: list[str] = []
    async for execution in client.list_workflows(query):
        if execution.id in seen:
            continue  # an older run of a turn already listed
        seen.add(execution.id)
        if session_id is not None:
            theirs = await _memo_session(execution)
            if theirs is None:
                theirs = await _session_of(client, execution.id, execution.run_id)
            if theirs != session_id:
                continue
        found.append(execution.id)
        if len(found) >= limit:
            break
    return found


async def _memo_session(execution: WorkflowExecution) -> str | None:
    """The session a turn's memo names, if it has one."""
    try:
        memo = await execution.memo()
    except Exception:  # a memo this process cannot decode: ask the input
        return None
    value = memo.get(SESSION_MEMO)
    return value if isinstance(value, str) else None


async def _session_of(client: Client, turn_id: str, run_id: str) -> str | None:
    """The session a turn's input names; ``None`` when it cannot be read here."""
    handle = client.get_workflow_handle(turn_id, run_id=run_id)
    try:
        async for event in handle.fetch_history_events(page_size=1):
            started = event.workflow_execution_started_event_attributes
            (inp,) = await client.data_converter.decode(list(started.input.payloads), [TurnInput])
            return str(inp.session_id)
    except Exception:  # a codec without keys, a history gone meanwhile: list it anyway
        return None
    return None
