"""What crosses Temporal: workflow and activity inputs and outputs, and the audit records.

One input model per workflow and activity. Fields added later MUST get defaults so that
histories recorded before them still decode. What the envelopes leave unsaid on the wire
(their defaults) is ``tooltrail.core.envelopes``'s business: ``model_dump()`` says every field.
Activity names are stable forever: a renamed activity breaks every turn in flight. Pure
module: workflow code imports it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from tooltrail.core.config import LARGE_OUTPUT_BYTES, RunConfig
from tooltrail.core.detection import LoopDetector
from tooltrail.core.hooks import HookDecision
from tooltrail.core.memoize import MemoCache, MemoEntry, MemoPlan
from tooltrail.core.messages import Message, ModelResponse, ThinkingSetting, Usage
from tooltrail.core.planner import CallVerdict
from tooltrail.core.recovery import Analysis
from tooltrail.core.results import Part, ToolCall, ToolDispatchResult
from tooltrail.core.signatures import SignedApproval

__all__ = [
    "ACCESS_AUTHORIZE",
    "APPROVAL_PROOF",
    "ATTEMPT_OUTCOME",
    "ATTEMPT_TIMED_OUT",
    "AUDIT_RECORD",
    "LOCAL_ATTEMPT_MARGIN",
    "MODEL_TURN",
    "RECOVERY_REFLECT",
    "SESSION_CLEANUP",
    "SESSION_MEMO",
    "TOOL_CATALOG",
    "TOOL_EXECUTE",
    "TOOL_ON_PEER",
    "TRAIL_HEAD_MEMO",
    "TURN_PREPARE",
    "AgentCarry",
    "AgentProgress",
    "AgentRunInput",
    "AgentRunOutput",
    "ApprovalInput",
    "ApprovalProofOutcome",
    "ApprovalProofRequest",
    "AttemptOutcome",
    "AttemptResult",
    "AuditEvent",
    "AuthorizeInput",
    "AuthorizeOutcome",
    "BreakerRefused",
    "CloseSessionInput",
    "ConversationAppend",
    "EventKind",
    "ExecuteAttempt",
    "Flush",
    "HookRefused",
    "HooksPassed",
    "HostFeatures",
    "InfraFailed",
    "MemoHit",
    "MemoSeen",
    "MemoryEntry",
    "ModelPhase",
    "ModelSettings",
    "ModelTurnOutcome",
    "ModelTurnRequest",
    "PendingApproval",
    "PrepareTurn",
    "Ran",
    "RecordTurn",
    "RecordedAttempt",
    "ReflectInput",
    "ReflectOutcome",
    "SessionState",
    "ShadowPlan",
    "ShadowServed",
    "ToolMeta",
    "TurnInput",
    "TurnOutput",
    "TurnPlan",
    "TurnRecord",
    "TurnRun",
    "TurnStatus",
    "WorkerCatalog",
]

# The activities' names, all of them: stable forever (a renamed activity breaks every turn
# in flight), so they are written here once and only referred to elsewhere.
TOOL_EXECUTE = "tooltrail.tool.execute"
"""Activity: run one attempt of one call (hooks, breaker gate, body, post hooks)."""
AUDIT_RECORD = "tooltrail.audit.record"
"""Activity: write a turn's pending audit records (and, at its end, its final status)."""
SESSION_CLEANUP = "tooltrail.session.cleanup"
"""Activity: remove a session's scratch directory."""
TOOL_CATALOG = "tooltrail.tool.catalog"
"""Activity: the tools a worker serves (MCP servers' included), for clients to list."""
RECOVERY_REFLECT = "tooltrail.recovery.reflect"
"""Activity: ask the host's reflector about a failed attempt."""
MODEL_TURN = "tooltrail.model.turn"
"""Activity: append a turn's new messages to the run's conversation and ask the model."""
TOOL_ON_PEER = "ToolOnPeerWorker"
"""``ApplicationError`` type of an attempt refused for a peer: ``details[0]`` is its queue."""

ATTEMPT_TIMED_OUT = "ToolAttemptTimedOut"
"""``ApplicationError`` type of a tool attempt that ran out of its time (non-retryable)."""

LOCAL_ATTEMPT_MARGIN = timedelta(seconds=1)
"""What a local tool attempt's start-to-close timeout adds to its time: the attempt bounds
itself to its time and fails ``ATTEMPT_TIMED_OUT`` first, because the SDK retries a local
activity's own start-to-close timeout whatever its retry policy says."""

ACCESS_AUTHORIZE = "tooltrail.access.authorize"
"""Activity: the worker's access gate answers a preflight (``Tooltrail.authorize_tool``)."""
TURN_PREPARE = "tooltrail.turn.prepare"
"""Activity (local): plan a standalone turn where the tools live (``TurnPlan``)."""
SESSION_MEMO = "tooltrail.session"
"""The memo key where a turn started by a client names its session (``audit verify
--session`` reads it from Temporal's listing)."""
APPROVAL_PROOF = "tooltrail.approval.proof"
"""Activity (local only): take up an accepted approval (a signed one once across the runs of
its turn) and prove it to the worker that runs the call (``tooltrail.core.proofs``)."""
TRAIL_HEAD_MEMO = "tooltrail.trail_head"
"""The memo key where a turn that ends without a result (failed, cancelled) anchors its
run's hash chain head (``TurnOutput.trail_head`` is the completed turns' anchor)."""

EventKind = Literal[
    "turn_started",
    "tool_call_received",
    "tool_pre",
    "tool_post",
    "hook_decision",
    "loop_detected",
    "breaker_refused",
    "tool_routed",
    "recovery_decision",
    "turn_cancelled",
    "turn_end",
    "turn_reconciled",
]
TurnStatus = Literal[
    "running", "completed", "failed", "cancelled", "terminated", "timed_out", "lost"
]
"""A turn's status; ``terminated``, ``timed_out`` and ``lost`` are set by reconciliation only
(the workflow cannot write them: Temporal ended it without running its code, or does not
know it at all: ``lost``)."""


class AuditEvent(BaseModel):
    """One event of a turn, as recorded in the audit trail (unique per turn, run and ``seq``)."""

    seq: int
    """Position in the turn's event stream, from 0; deterministic for a given history."""
    kind: EventKind | str
    """What happened (``tool_pre``, ``tool_post``, ...)."""
    tool_call_id: str | None = None
    """The model-issued call id, for call events."""
    tool_name: str | None = None
    """The requested tool name, for call events."""
    attempt: int | None = None
    """The 0-based attempt index, for attempt events."""
    payload: dict[str, Any] = Field(default_factory=dict)
    """Everything about the event, with full, untruncated input and output."""
    created_at: datetime
    """Workflow time at which the event was produced."""
    run_id: str | None = None
    """The Temporal run of the turn's workflow id that produced it (set when stored; empty
    for records written before run ids; ``None`` before the record reaches the database)."""
    temporal_attempt: int | None = None
    """For attempt records: Temporal's activity attempt (from 1) that ran the tool. Attempts
    below it were lost with their workers (``payload["lost_attempts"]`` names them)."""
    worker: str | None = None
    """For attempt records: the identity of the worker that ran that attempt."""
    digest: str | None = None
    """The hash chain's digest of the record (its content and its run's previous record's
    digest, ``tooltrail.core.chain``); set when stored."""


class MemoryEntry(BaseModel):
    """One memory note of a session."""

    kind: Literal["trajectory"] | str = "trajectory"
    """The category; ``trajectory`` for successful calls."""
    content: str
    """The note."""
    tool_call_id: str | None = None
    """The call it came from."""
    created_at: datetime
    """Workflow time of the call's completion."""
    seq: int = 0
    """The ``seq`` of the call's ``tool_post`` event (the idempotency key with the turn and
    the run)."""
    turn_id: str = ""
    """The turn it came from."""
    run_id: str = ""
    """The Temporal run of the turn that made it (the audit write fills it in; empty for
    notes stored before memory was run-aware, or whose run is unknown)."""
    session_id: str = ""
    """The session it belongs to."""


class TurnRecord(BaseModel):
    """The ``turn`` row of a turn."""

    turn_id: str
    session_id: str
    status: TurnStatus = "running"
    started_at: datetime
    ended_at: datetime | None = None
    call_count: int = 0
    error: str | None = None
    error_type: str | None = None
    rerun_of: str | None = None
    mode: Literal["live", "rerun", "shadow"] = "live"
    run_id: str = ""
    """The Temporal run the row describes (the latest run of the turn's workflow id)."""


class TurnRun(BaseModel):
    """One Temporal run of a turn's workflow id that wrote audit records."""

    run_id: str
    """Temporal's run id (empty for records written before run ids)."""
    branched_from: str | None = None
    """The run that was the turn's latest when this one first wrote (a reset's base)."""
    created_at: datetime
    """When the run's first record was written (worker clock)."""
    latest: bool = False
    """Whether the turn's row describes this run (the run its workflow id ended with)."""


class SessionState(BaseModel):
    """What carries from one turn of a session to the next (stored in ``session_state``)."""

    version: int = 0
    """How many turns saved it; a write never replaces a newer version."""
    detector: LoopDetector = Field(default_factory=LoopDetector)
    """The loop detector's window and warned set."""
    memo: MemoCache = Field(default_factory=MemoCache)
    """The ``MemoizingMiddleware`` cache."""
    acks_applied: int = 0
    """The number of the last loop-warning acknowledgement taken into ``detector``."""


class ConversationAppend(BaseModel):
    """Messages an agent turn adds to its run's conversation (its tool results)."""

    run_id: str
    start_seq: int
    """Where the first message goes; the others follow it."""
    messages: list[Message]


class Flush(BaseModel):
    """Audit records produced by the workflow since the last successful write."""

    turn_id: str
    session_id: str
    turn: TurnRecord | None = None
    """The turn's row when it changed since the last write; ``None`` when it did not."""
    events: list[AuditEvent] = Field(default_factory=list)
    memory: list[MemoryEntry] = Field(default_factory=list)
    session: SessionState | None = None
    """The session's state at the end of the turn (final record only)."""
    conversation: ConversationAppend | None = None
    """An agent turn's tool results for its run's conversation (final record only)."""
    run_id: str = ""
    """The Temporal run that produced the records (the audit activity fills it in)."""


class HostFeatures(BaseModel):
    """What the host wiring installs, as far as the workflow must know it."""

    hooks: bool = False
    """Pre/post tool hooks are installed (a loop stop must ask them first)."""
    memory: bool = True
    """Successful calls write trajectory memory."""
    approvers: dict[str, str] = Field(default_factory=dict)
    """Approvers whose signed approvals the turn accepts, name to base64 Ed25519 public
    key; empty: approvals are unsigned (``by`` is a claim)."""


class ToolMeta(BaseModel):
    """What the workflow needs to know of a tool's declaration (taken from the host)."""

    timeout_s: float | None = None
    retry_on_interrupt: bool = True
    local: bool = False
    """Attempts run as local activities (``@tool(local=True)``)."""
    loop_threshold: int | None = None
    """The tool's own loop threshold (``@tool(loop_thresholds=...)``); ``None``: the run's."""
    primary_param: str | None = None
    """The argument that identifies an operation for loop detection; ``None``: all of them."""
    loop_suggestion: str | None = None
    """The end of the host's loop warning for this tool's patterns."""


class PrepareTurn(BaseModel):
    """Input of ``tooltrail.turn.prepare`` (a local activity: it never enters the history)."""

    session_id: str
    calls: list[ToolCall]
    advertised: list[str] | None = None
    """The names the turn advertises; ``None``: the worker's tools (the plan lists them)."""
    parallel: bool = False
    """Judge the calls for parallel waves."""
    shadow: bool = False
    """A shadow replay: it starts from the original turn's state, so none is read."""
    interactive: bool = False
    """The turn may wait for approvals: the workers of its queue must agree on approvers."""


class TurnPlan(BaseModel):
    """What the worker decides for a turn, because the tools and the database are there.

    A standalone turn gets it from ``tooltrail.turn.prepare``, an agent turn with the
    model's answer (``ModelTurnOutcome.plan``).
    """

    advertised: list[str] | None = None
    """The worker's tool names, when the turn left them to the worker; else ``None``."""
    tools: dict[str, ToolMeta] = Field(default_factory=dict)
    """The declarations of the worker's tools, where they differ from ``ToolMeta()``."""
    features: HostFeatures = Field(default_factory=HostFeatures)
    verdicts: list[CallVerdict] | None = None
    """Per call, the tool's concurrency declaration evaluated on its arguments (parallel
    mode); ``None`` plans every call as unsafe."""
    memo: MemoPlan | None = None
    """The host's ``MemoizingMiddleware`` configuration, if it has one."""
    memo_paths: dict[str, list[str]] = Field(default_factory=dict)
    """Per call id, the paths it touches (for write-tool eviction)."""
    session: SessionState = Field(default_factory=SessionState)
    """The session's state as the previous turn left it."""


class AuthorizeInput(BaseModel):
    """Input of ``AuthorizeToolWorkflow`` and its activity: a preflight's call."""

    name: str
    arguments: dict[str, Any] | None = None


class AuthorizeOutcome(BaseModel):
    """A worker's access gate on a preflight (spec GIA §6.4)."""

    allowed: bool
    reason: str = ""
    unknown: bool = False
    """The worker has no tool of that name (the client raises ``UnknownToolError``)."""


class WorkerCatalog(BaseModel):
    """The tools a worker serves, as its registry holds them (``ToolCatalogWorkflow``)."""

    names: list[str] = Field(default_factory=list)
    tools: dict[str, ToolMeta] = Field(default_factory=dict)


class RecordedAttempt(BaseModel):
    """One attempt's result as the audit trail holds it (for shadow replays)."""

    output: str | list[Part]
    is_error: bool
    duration_ms: float = 0.0
    resolved_tool_name: str
    display_hint: str | None = None


class ShadowPlan(BaseModel):
    """A shadow replay: every tool result comes from the original turn's audit trail."""

    of_turn: str
    attempts: dict[str, RecordedAttempt] = Field(default_factory=dict)
    """By ``{tool_call_id}#{attempt}``."""
    detector: LoopDetector | None = None
    """The loop detector as the original turn started, when it was recorded."""


class TurnInput(BaseModel):
    """Input of ``TurnWorkflow``."""

    session_id: str
    calls: list[ToolCall]
    advertised: list[str] | None = None
    """The tool names advertised to the model for this turn; ``None``: the tools the
    deployment's workers offer (``TurnPlan.advertised``)."""
    config: RunConfig = Field(default_factory=RunConfig)
    ends_run: bool = False
    """This turn ends a run: a loop pattern at stop level is cleared for the next run."""
    rerun_of: str | None = None
    """The turn this one re-runs (``tooltrail rerun``)."""
    shadow: ShadowPlan | None = None
    """Serve every tool result from the audit trail: no tool runs, nothing shared changes."""
    model: ModelPhase | None = None
    """Start with a model call: its tool calls are the turn's calls (``calls`` is ignored)."""


class TurnOutput(BaseModel):
    """Output of ``TurnWorkflow``: one result per call, in the model's order."""

    turn_id: str
    results: list[ToolDispatchResult]
    """Empty for an agent turn: its results went to the conversation and the audit trail
    (``tt.get_turn(turn_id).result()`` reads them back)."""
    assistant: Message | None = None
    """With a model phase: the model's answer (its text and tool calls)."""
    usage: Usage | None = None
    """With a model phase: the tokens the model call spent."""
    stop_reason: str | None = None
    """With a model phase: why the model stopped (``ModelResponse.stop_reason``)."""
    trail_head: str = ""
    """The hash chain digest of the run's last audit record (``tooltrail.core.chain``), kept in
    Temporal's history where the database cannot rewrite it; empty when none is known."""


class ExecuteAttempt(BaseModel):
    """Input of the ``tooltrail.tool.execute`` activity."""

    turn_id: str = ""
    """Empty: the id of the workflow that scheduled the attempt (a turn's id is its
    workflow's id, so the history need not hold it once per call)."""
    session_id: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    attempt: int = 0
    turn_number: int = 0
    """The turn's number in its session (how many turns saved the session's state before
    it), for the hooks' contexts (spec §7)."""
    skip_pre_hooks: bool = False
    """True when a human already approved this attempt (interactive ``Ask``). Honoured by a
    regular activity only with a valid ``approval_proof``: otherwise the hooks run."""
    approval_proof: str = ""
    """The worker's proof of the approval (``tooltrail.core.proofs.approval_proof``), bound
    to the run, the call and its arguments."""
    large_output_bytes: int = LARGE_OUTPUT_BYTES
    """Outputs above this size are stored in the database, not returned (0: never). The
    default is ``RunConfig``'s, so the common case costs no history bytes."""
    hooks_only: bool = False
    """Run the pre-tool hooks and stop: the loop detector refuses this attempt unless a hook
    blocks it first (hooks come before detection)."""
    shadow: bool = False
    """A shadow replay: never run the tool; serve ``recorded`` (or report it missing)."""
    recorded: RecordedAttempt | None = None
    """The original turn's result of this attempt (shadow replays)."""
    memo: MemoEntry | None = None
    """A memoize hit to serve at the memoize layer's place in the pipeline (a layer that is
    not registered first); the layers before it handle it like a result."""


class MemoSeen(BaseModel):
    """A successful result as the memoize layer saw it come back from the inner layers."""

    output: str | list[Part]
    duration_ms: float = 0.0
    resolved_tool_name: str = ""
    display_hint: str | None = None


class _Result(BaseModel):
    """What every completed attempt says: the fields of the call's result."""

    output: str | list[Part]
    is_error: bool = False
    duration_ms: float = 0.0
    resolved_tool_name: str = ""
    """The tool that ran; empty on the wire when it is the requested one (the workflow
    fills it in as it receives the outcome)."""
    display_hint: str | None = None


class Ran(_Result):
    """The attempt ran through the middleware pipeline and the registry core.

    Its result is the tool's (or the core's soft text, such as an interrupted attempt's): it
    goes through the POST phase and, when it failed, recovery.
    """

    kind: Literal["ran"] = "ran"
    reflector: Literal["noop", "custom"] | None = None
    """The worker's reflector, told with failed attempts: with ``noop`` the workflow knows
    the analysis without asking, with ``custom`` (or ``None``) it asks the reflector.
    ``None`` on successes, which consult no reflector."""
    started_at: datetime | None = None
    """Wall-clock time the tool body started (worker clock), for the audit trail."""
    finished_at: datetime | None = None
    """Wall-clock time the tool body returned (worker clock)."""
    dispatch: dict[str, Any] | None = None
    """The dispatcher's audit record (access, guardrails, idempotency: spec §8)."""
    output_ref: str | None = None
    """A large output was stored in the database under this key; ``output`` is empty."""
    output_hash: str | None = None
    """With ``output_ref``: the stable hash of the output's text."""
    output_preview: str | None = None
    """With ``output_ref``: the first characters of the output's text (for memory)."""
    post_hook_errors: list[str] = Field(default_factory=list)
    memo_served: bool = False
    """The memoize layer served the request's ``memo`` hit: nothing inside it ran."""
    memo_seen: MemoSeen | None = None
    """What the memoize layer (not registered first) saw succeed, for the cache."""
    """Post-tool hooks that raised (logged and ignored)."""
    temporal_attempt: int = 1
    """Temporal's activity attempt that ran the body (above 1: earlier ones were lost)."""
    worker: str = ""
    """The identity of the worker that ran the body."""
    lost_attempts: list[dict[str, Any]] = Field(default_factory=list)
    """The Temporal attempts below ``temporal_attempt``, lost with their workers:
    ``{"temporal_attempt": n, "worker": identity or None}`` (``None``: it never heartbeat)."""


class ShadowServed(_Result):
    """A shadow replay's attempt: the original turn's result, screened by today's gate.

    No tool ran and nothing shared changed; the result goes through the POST phase and
    recovery like a ran attempt's.
    """

    kind: Literal["shadow"] = "shadow"
    reflector: Literal["noop", "custom"] | None = None
    """As for ``Ran``."""


class HookRefused(BaseModel):
    """A pre-tool hook blocked the attempt or asked about it: the tool did not run."""

    kind: Literal["hook_refused"] = "hook_refused"
    hook: HookDecision


class HooksPassed(BaseModel):
    """The pre-tool hooks let a hooks-only attempt through (the workflow refuses it then)."""

    kind: Literal["hooks_passed"] = "hooks_passed"


class BreakerRefused(BaseModel):
    """The circuit breaker of the requested tool is open: the tool did not run.

    The result is ``tooltrail.core.text.BREAKER_OPEN``; no POST phase, no recovery.
    """

    kind: Literal["breaker_refused"] = "breaker_refused"


class MemoHit(_Result):
    """Served from the session's memoize cache by the workflow: no activity ran."""

    kind: Literal["memo_hit"] = "memo_hit"


class InfraFailed(_Result):
    """The attempt's activity failed once Temporal's retries were spent (spec §14).

    Made by the workflow: a soft failed attempt with the failure's text, which goes through
    the POST phase and recovery like a tool's failure.
    """

    kind: Literal["infra_failed"] = "infra_failed"


AttemptOutcome = Annotated[
    Ran | ShadowServed | HookRefused | HooksPassed | BreakerRefused | MemoHit | InfraFailed,
    Field(discriminator="kind"),
]
"""One attempt's outcome, told by its ``kind``.

The tool activity (``tooltrail.tool.execute``) returns ``ran``, ``shadow``,
``hook_refused``, ``hooks_passed`` or ``breaker_refused``, never a raised tool error; the
workflow makes ``memo_hit`` (no activity ran) and ``infra_failed`` (the activity's
infrastructure retries were spent) itself, and matches every kind exhaustively. ``ran``
is the common case: its ``kind`` is left unsaid on the wire (``tooltrail.core.envelopes``).
"""
AttemptResult = Ran | ShadowServed | MemoHit | InfraFailed
"""The kinds of ``AttemptOutcome`` that carry a result for the POST phase (and recovery)."""
ATTEMPT_OUTCOME: Any = AttemptOutcome
"""``AttemptOutcome`` as an activity's ``result_type``."""


class RecordTurn(BaseModel):
    """Input of ``tooltrail.audit.record``."""

    flush: Flush
    must_persist: bool = True
    """Raise when the database cannot be written (Temporal retries); with False the
    activity returns False instead and the workflow keeps the records for a later write."""


class CloseSessionInput(BaseModel):
    """Input of ``CloseSessionWorkflow`` and ``tooltrail.session.cleanup``."""

    session_id: str


class ReflectInput(BaseModel):
    """Input of ``tooltrail.recovery.reflect``."""

    error: str
    tool: str
    """The tool name this attempt requested."""
    resolved_tool: str
    """The tool that ran (schemas are looked up under it first)."""
    arguments: dict[str, Any]
    attempt: int
    max_attempts: int
    task: str = ""


class ReflectOutcome(BaseModel):
    """Output of ``tooltrail.recovery.reflect``: an analysis, or why there is none."""

    analysis: Analysis | None = None
    error: str | None = None
    """Set when the reflector raised: recovery then fails softly."""


class ApprovalInput(BaseModel):
    """A human's answer to a hook's ``Ask`` (the ``approval`` Update of ``TurnWorkflow``)."""

    tool_call_id: str
    approved: bool
    reason: str | None = None
    """Why it was denied (the model reads it)."""
    by: str | None = None
    """Who decided (recorded in the audit trail); without a signature, only a claim."""
    signed: SignedApproval | None = None
    """The approver's signed statement; required when the deployment has approvers, and
    then ``approved``, ``by`` and ``reason`` are the statement's."""


class ApprovalProofRequest(BaseModel):
    """Input of ``tooltrail.approval.proof``: an approval the turn's validator accepted."""

    tool_call_id: str
    arguments_sha256: str
    """``arguments_digest`` of the arguments the call runs with."""
    signature: str | None = None
    """The signed statement's signature (signed approvals: used once across runs)."""


class ApprovalProofOutcome(BaseModel):
    """The proof of an approval, or why the worker refuses to take it up."""

    proof: str = ""
    refused: str | None = None
    """The reason (the approval was used by another run, or the worker holds no key)."""


class PendingApproval(BaseModel):
    """A call parked until a human decides (the ``pending_approvals`` query)."""

    tool_call_id: str
    tool_name: str
    question: str
    arguments: dict[str, Any]
    asked_at: datetime | None = None
    """When the call started waiting (workflow time)."""
    deadline: datetime | None = None
    """When the wait ends with the headless refusal if nobody answers."""
    arguments_sha256: str | None = None
    """The digest a signed approval must name (``tooltrail.core.signatures.arguments_digest``);
    ``None`` for arguments JSON cannot carry (NaN), which no approval can match."""


class ModelSettings(BaseModel):
    """Which model answers, and how."""

    model: str | None = None
    """The model name (default: the worker's client default)."""
    temperature: float | None = None
    """Sampling temperature, sent only to models that take one (not to Anthropic's, nor to
    OpenAI's reasoning families: there it is dropped with a warning, and the run goes on)."""
    max_tokens: int | None = None
    """Most tokens to generate, thinking included (OpenAI ``max_completion_tokens``);
    ``None``: the client's default (Anthropic 8192, plus the thinking budget)."""
    thinking: ThinkingSetting | None = None
    """Anthropic extended thinking: a budget in tokens (at least 1024, below
    ``max_tokens``), ``"adaptive"`` or ``"disabled"``; ``None`` leaves the model's default.
    The thinking blocks are kept in the conversation and sent back with the tool results."""
    prompt_caching: bool = False
    """Anthropic prompt caching of the system prompt and the tool definitions (OpenAI
    caches long prompts by itself); the cached tokens are counted in ``Usage``."""


class ModelPhase(BaseModel):
    """The model call that starts a turn (instead of ready-made calls).

    The model is offered the catalog of the turn's advertised tools: the worker's own and
    its queue's live peers' (the schemas stay out of every turn's history). The model
    activity reads the session's state with the conversation; the turn appends its tool
    results to the conversation with its final audit record and returns neither, so an
    agent run's history carries no tool output and no loop-detector window from turn to
    turn.
    """

    run_id: str
    """The conversation's id (the agent run)."""
    start_seq: int
    """Where ``new_messages`` go in the conversation; the answer follows them."""
    new_messages: list[Message]
    """What the model has not seen yet: the first prompt, or the last turn's tool results."""
    settings: ModelSettings = Field(default_factory=ModelSettings)
    local: bool = False
    """Ask the model in a local activity (``start_agent(local_model=True)``)."""


class ModelTurnRequest(BaseModel):
    """Input of ``tooltrail.model.turn``."""

    phase: ModelPhase
    turn_id: str
    advertised: list[str] | None = None
    """The tools the model is offered (from the catalog of the worker and its live peers);
    ``None``: all of them."""
    verdicts: bool = False
    """Judge the answer's tool calls for parallel dispatch (the concurrency declarations
    are host code, so the worker judges them, as it does for a standalone turn)."""
    session_id: str | None = None
    """The turn's session: its saved state comes back in the plan (``None``: none read)."""
    interactive: bool = False
    """The turn may wait for approvals: the workers of its queue must agree on approvers."""


class ModelTurnOutcome(BaseModel):
    """Output of ``tooltrail.model.turn``."""

    response: ModelResponse
    reused: bool = False
    """The answer was already stored (a retried activity): the model was not asked again."""
    plan: TurnPlan = Field(default_factory=TurnPlan)
    """The worker's plan of the answer's calls (its ``session`` is the session's state)."""


class AgentCarry(BaseModel):
    """What an agent run carries across continue-as-new."""

    turn_index: int = 0
    next_seq: int = 0
    new_messages: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    turns: list[str] = Field(default_factory=list)


class AgentRunInput(BaseModel):
    """Input of ``AgentRunWorkflow``."""

    session_id: str
    messages: list[Message] = Field(default_factory=list)
    """The opening messages (system, user); later segments of the run carry nothing here."""
    settings: ModelSettings = Field(default_factory=ModelSettings)
    advertised: list[str] | None = None
    """The tools the model is offered; ``None``: those the deployment's workers offer."""
    config: RunConfig = Field(default_factory=RunConfig)
    max_turns: int = Field(default=10, ge=1)
    turns_per_segment: int = Field(default=20, ge=1)
    """Continue-as-new after this many turns (or sooner if Temporal suggests it)."""
    carry: AgentCarry | None = None
    local_model: bool = False
    """Every model call of the run is a local activity (``start_agent(local_model=True)``)."""


class AgentRunOutput(BaseModel):
    """Output of ``AgentRunWorkflow``."""

    run_id: str
    text: str
    """The model's final answer."""
    turns: list[str]
    """The turn ids, in order."""
    usage: Usage
    stopped_by: Literal["answer", "max_turns"]
    stop_reason: str | None = None
    """Why the model stopped in the last turn (``StopReason``): ``end_turn`` for an answer,
    ``refusal`` when it declined (``text`` is then its refusal), ``max_tokens`` for an
    answer cut short, ``tool_use`` when ``max_turns`` ended the run, ..."""


class AgentProgress(BaseModel):
    """The ``progress`` query of ``AgentRunWorkflow``."""

    run_id: str
    turn_index: int
    turns: list[str]
    usage: Usage
    status: Literal["model", "tools", "done"]
