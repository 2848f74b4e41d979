"""What crosses Temporal: workflow and activity inputs and outputs, and the audit records.

One input model per workflow and activity. Fields added later MUST get defaults so that
histories recorded before them still decode. Activity names are stable forever: a renamed
activity breaks every turn in flight. Pure module: workflow code imports it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
    model_validator,
)

from tooltrail.config import LARGE_OUTPUT_BYTES, RunConfig
from tooltrail.detection import LoopDetector
from tooltrail.hooks import HookDecision
from tooltrail.llm.messages import Message, ModelResponse, ThinkingSetting, Usage
from tooltrail.memoize import MemoCache, MemoPlan
from tooltrail.planner import CallVerdict
from tooltrail.recovery import Analysis
from tooltrail.results import Part, ToolCall, ToolDispatchResult
from tooltrail.text import canonical_json

__all__ = [
    "AUDIT_RECORD",
    "DISPATCH_FIELDS",
    "MODEL_TURN",
    "RECOVERY_REFLECT",
    "SESSION_CLEANUP",
    "TOOL_CATALOG",
    "TOOL_EXECUTE",
    "AgentCarry",
    "AgentProgress",
    "AgentRunInput",
    "AgentRunOutput",
    "ApprovalInput",
    "AttemptOutcome",
    "AuditEvent",
    "CloseSessionInput",
    "Compact",
    "ConversationAppend",
    "EventKind",
    "ExecuteAttempt",
    "Flush",
    "HostFeatures",
    "MemoryEntry",
    "ModelPhase",
    "ModelSettings",
    "ModelTurnOutcome",
    "ModelTurnRequest",
    "PendingApproval",
    "RecordTurn",
    "RecordedAttempt",
    "ReflectInput",
    "ReflectOutcome",
    "SessionState",
    "ShadowPlan",
    "ToolMeta",
    "TurnInput",
    "TurnOutput",
    "TurnRecord",
    "TurnStatus",
    "WorkerCatalog",
    "pack_dispatch",
    "unpack_dispatch",
]

TOOL_EXECUTE = "tooltrail.tool.execute"
"""Activity: flush pending audit records, then run one attempt of one call."""
AUDIT_RECORD = "tooltrail.audit.record"
"""Activity: flush pending audit records and the turn's final status."""
SESSION_CLEANUP = "tooltrail.session.cleanup"
"""Activity: remove a session's scratch directory."""
TOOL_CATALOG = "tooltrail.tool.catalog"
"""Activity: the tools a worker serves (MCP servers' included), for clients to advertise."""
RECOVERY_REFLECT = "tooltrail.recovery.reflect"
"""Activity: ask the host's reflector about a failed attempt."""

EventKind = Literal[
    "turn_started",
    "tool_call_received",
    "tool_pre",
    "tool_post",
    "hook_decision",
    "loop_detected",
    "breaker_refused",
    "recovery_decision",
    "turn_cancelled",
    "turn_end",
]
TurnStatus = Literal["running", "completed", "failed", "cancelled"]


class AuditEvent(BaseModel):
    """One event of a turn, as recorded in the audit trail (unique per turn and ``seq``)."""

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
    """The ``seq`` of the call's ``tool_post`` event (the idempotency key with the turn)."""
    turn_id: str = ""
    """The turn it came from."""
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


class SessionState(BaseModel):
    """What carries from one turn of a session to the next (stored in ``session_state``)."""

    version: int = 0
    """How many turns saved it; a write never replaces a newer version."""
    detector: LoopDetector = Field(default_factory=LoopDetector)
    """The loop detector's window and warned set."""
    memo: MemoCache = Field(default_factory=MemoCache)
    """The ``MemoizingMiddleware`` cache."""


_PLAIN_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}


def _plain_defaults(cls: type[BaseModel]) -> dict[str, Any]:
    """The defaults of ``cls`` that serialize as themselves (None, bools, numbers, text, [])."""
    found = _PLAIN_DEFAULTS.get(cls)
    if found is None:
        found = {}
        for name, field in cls.model_fields.items():
            if field.is_required():
                continue
            default = field.get_default(call_default_factory=True)
            plain = default is None or isinstance(default, bool | int | float | str)
            if plain or default in ([], {}):
                found[name] = default
        _PLAIN_DEFAULTS[cls] = found
    return found


class Compact(BaseModel):
    """A model serialized without the fields that hold their default value.

    For the envelopes that cross Temporal once per tool call or turn: every byte of them is
    stored in the workflow history, and decoding fills the defaults back in. So these
    defaults are part of the wire format: changing one changes what recorded histories
    decode to (and how they replay). Only plain defaults are left out (``None``, ``False``,
    numbers, texts, empty lists and dicts); nested models always travel whole.
    """

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name, default in _plain_defaults(type(self)).items():
                if name in data and data[name] == default:
                    del data[name]
            self._pack(data)
        return data

    def _pack(self, data: dict[str, Any]) -> None:
        """Shorten ``data`` (this model's dump) further; the model's validator undoes it."""


class ConversationAppend(BaseModel):
    """Messages an agent turn adds to its run's conversation (its tool results)."""

    run_id: str
    start_seq: int
    """Where the first message goes; the others follow it."""
    messages: list[Message]


class Flush(Compact):
    """Audit records produced by the workflow since the last successful write."""

    turn_id: str = ""
    session_id: str = ""
    turn: TurnRecord | None = None
    """The turn's row when it changed since the last write; ``None`` when it did not."""
    events: list[AuditEvent] = Field(default_factory=list)
    memory: list[MemoryEntry] = Field(default_factory=list)
    session: SessionState | None = None
    """The session's state at the end of the turn (final record only)."""
    conversation: ConversationAppend | None = None
    """An agent turn's tool results for its run's conversation (final record only)."""

    @model_validator(mode="after")
    def _ids_from_turn(self) -> Flush:
        # Histories recorded before turn_id existed carry the ids in the turn row only.
        if self.turn is not None:
            self.turn_id = self.turn_id or self.turn.turn_id
            self.session_id = self.session_id or self.turn.session_id
        return self


class HostFeatures(BaseModel):
    """What the host wiring installs, as far as the workflow must know it."""

    hooks: bool = False
    """Pre/post tool hooks are installed (a loop stop must ask them first)."""
    memory: bool = True
    """Successful calls write trajectory memory."""


class ToolMeta(BaseModel):
    """What the workflow needs to know of a tool's declaration (taken from the host)."""

    timeout_s: float | None = None
    retry_on_interrupt: bool = True
    local: bool = False
    """Attempts run as local activities (``@tool(local=True)``)."""


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


class TurnInput(Compact):
    """Input of ``TurnWorkflow``."""

    session_id: str
    calls: list[ToolCall]
    advertised: list[str]
    """The tool names advertised to the model for this turn."""
    config: RunConfig = Field(default_factory=RunConfig)
    tools: dict[str, ToolMeta] = Field(default_factory=dict)
    verdicts: list[CallVerdict] | None = None
    """Per call, the tool's concurrency declaration evaluated on its arguments (parallel
    mode); ``None`` plans every call as unsafe."""
    features: HostFeatures = Field(default_factory=HostFeatures)
    session: SessionState = Field(default_factory=SessionState)
    """The session's state as the previous turn left it."""
    ends_run: bool = False
    """This turn ends a run: a loop pattern at stop level is cleared for the next run."""
    memo: MemoPlan | None = None
    """The host's ``MemoizingMiddleware`` configuration, if it has one."""
    memo_paths: dict[str, list[str]] = Field(default_factory=dict)
    """Per call id, the paths it touches (for write-tool eviction)."""
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
    """Empty for an agent turn with ``ModelPhase.state_in_db``: its results went to the
    conversation and the audit trail (``tt.get_turn(turn_id).result()`` reads them back)."""
    assistant: Message | None = None
    """With a model phase: the model's answer (its text and tool calls)."""
    usage: Usage | None = None
    """With a model phase: the tokens the model call spent."""
    stop_reason: str | None = None
    """With a model phase: why the model stopped (``ModelResponse.stop_reason``)."""
    session: SessionState | None = None
    """The session's state as this turn left it, for an agent run's next turn in runs
    recorded before ``ModelPhase.state_in_db`` (other turns load it from the database,
    where the final record saved it)."""

    @field_serializer("results", mode="wrap")
    def _compact_results(
        self, results: list[ToolDispatchResult], handler: SerializerFunctionWrapHandler
    ) -> Any:
        # Unset optional fields are left out: the history holds every result once more.
        # (Only those: this is the turn's public result, and its dump should say the rest.)
        data = handler(results)
        if isinstance(data, list):
            for item in data:
                for key in ("display_hint", "output_ref"):
                    if isinstance(item, dict) and item.get(key, False) is None:
                        del item[key]
        return data


class ExecuteAttempt(Compact):
    """Input of the ``tooltrail.tool.execute`` activity."""

    turn_id: str = ""
    """Empty: the id of the workflow that scheduled the attempt (a turn's id is its
    workflow's id, so the history need not hold it once per call)."""
    session_id: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    attempt: int = 0
    flush: Flush | None = None
    skip_pre_hooks: bool = False
    """True when a human already approved this attempt (interactive ``Ask``)."""
    large_output_bytes: int = LARGE_OUTPUT_BYTES
    """Outputs above this size are stored in the database, not returned (0: never). The
    default is ``RunConfig``'s, so the common case costs no history bytes. (Workers before
    this default read a missing value as 0: an attempt they scheduled with 0 and a newer
    worker ran keeps a large output in the database rather than in the history.)"""
    hooks_only: bool = False
    """Run the pre-tool hooks and stop: the loop detector refuses this attempt unless a hook
    blocks it first (hooks come before detection)."""
    shadow: bool = False
    """A shadow replay: never run the tool; serve ``recorded`` (or report it missing)."""
    recorded: RecordedAttempt | None = None
    """The original turn's result of this attempt (shadow replays)."""


class AttemptOutcome(Compact):
    """Output of ``tooltrail.tool.execute``: the attempt's result, never a raised tool error."""

    output: str | list[Part]
    is_error: bool = False
    duration_ms: float = 0.0
    resolved_tool_name: str = ""
    """The tool that ran; empty on the wire when it is the requested one (the workflow
    fills it in as it receives the outcome)."""
    display_hint: str | None = None
    flushed: bool = True
    """False when the audit database could not be written; the workflow sends the records again."""
    reflector: Literal["noop", "custom"] | None = None
    """The worker's reflector, told with failed attempts: with ``noop`` the workflow knows
    the analysis without asking. ``None`` (successes, and failures from workers that left a
    custom reflector unsaid) asks the reflector."""
    started_at: datetime | None = None
    """Wall-clock time the tool body started (worker clock), for the audit trail."""
    finished_at: datetime | None = None
    """Wall-clock time the tool body returned (worker clock)."""
    hook: HookDecision | None = None
    """A pre-tool hook's Block or Ask: the tool did not run."""
    breaker_refused: bool = False
    """The circuit breaker of the requested tool is open: the tool did not run."""
    cached: bool = False
    """Served from the session's memoize cache by the workflow (no activity ran)."""
    dispatch: dict[str, Any] | None = None
    """The dispatcher's audit record (access, guardrails, idempotency: spec §8)."""
    output_ref: str | None = None
    """A large output was stored in the database under this key; ``output`` is empty."""
    output_hash: str | None = None
    """With ``output_ref``: the stable hash of the output's text."""
    output_preview: str | None = None
    """With ``output_ref``: the first characters of the output's text (for memory)."""
    post_hook_errors: list[str] = Field(default_factory=list)
    """Post-tool hooks that raised (logged and ignored)."""

    def _pack(self, data: dict[str, Any]) -> None:
        # The four timestamps and the duration as whole microseconds in one list ``t``:
        # [started, finished - started, duration, dispatch started - started, dispatch
        # finished - started]. ISO texts cost ~45 bytes each in every call's history.
        times = _pack_times(self, data)
        if times is not None:
            for name in ("started_at", "finished_at", "duration_ms"):
                data.pop(name, None)
            data["t"] = times

    @model_validator(mode="before")
    @classmethod
    def _unpack(cls, data: Any) -> Any:
        if isinstance(data, dict) and "t" in data:
            data = _unpack_times(data)
        return data


class RecordTurn(Compact):
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
    """Who decided (recorded in the audit trail)."""


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


MODEL_TURN = "tooltrail.model.turn"
"""Activity: append a turn's new messages to the run's conversation and ask the model."""


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
    """The model call that starts a turn (instead of ready-made calls)."""

    run_id: str
    """The conversation's id (the agent run)."""
    start_seq: int
    """Where ``new_messages`` go in the conversation; the answer follows them."""
    new_messages: list[Message]
    """What the model has not seen yet: the first prompt, or the last turn's tool results."""
    settings: ModelSettings = Field(default_factory=ModelSettings)
    catalog: list[dict[str, Any]] | None = Field(default_factory=list)
    """The tool catalog advertised to the model (OpenAI format); ``None``: the worker's own
    catalog of the turn's advertised tools (so the schemas are not in every turn's history)."""
    state_in_db: bool = False
    """The turn takes the session's state from the database (the model activity reads it
    with the conversation), appends its tool results to the conversation with its final
    audit record, and returns neither: the run's history then carries no tool output and
    no loop-detector window from turn to turn. ``False`` in runs recorded before."""
    local: bool = False
    """Ask the model in a local activity (``start_agent(local_model=True)``)."""


class ModelTurnRequest(BaseModel):
    """Input of ``tooltrail.model.turn``."""

    phase: ModelPhase
    turn_id: str
    flush: Flush | None = None
    advertised: list[str] | None = None
    """With a ``None`` catalog: the tools the model may be offered."""
    verdicts: bool = False
    """Judge the answer's tool calls for parallel dispatch (the concurrency declarations
    are host code, so the worker judges them, as the client does for a plain turn)."""
    session_id: str | None = None
    """Read this session's saved state and return it (``ModelPhase.state_in_db``)."""


class ModelTurnOutcome(BaseModel):
    """Output of ``tooltrail.model.turn``."""

    response: ModelResponse
    flushed: bool = True
    reused: bool = False
    """The answer was already stored (a retried activity): the model was not asked again."""
    verdicts: list[CallVerdict] | None = None
    """One per tool call of the answer, when the request asked for them."""
    session: SessionState | None = None
    """The session's saved state, when the request named the session."""


class AgentCarry(BaseModel):
    """What an agent run carries across continue-as-new."""

    turn_index: int = 0
    next_seq: int = 0
    new_messages: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    session: SessionState = Field(default_factory=SessionState)
    turns: list[str] = Field(default_factory=list)


class AgentRunInput(BaseModel):
    """Input of ``AgentRunWorkflow``."""

    session_id: str
    messages: list[Message] = Field(default_factory=list)
    """The opening messages (system, user); later segments of the run carry nothing here."""
    settings: ModelSettings = Field(default_factory=ModelSettings)
    catalog: list[dict[str, Any]] = Field(default_factory=list)
    """Unused: a run's turns offer the worker's own catalog (older runs carried it here)."""
    advertised: list[str] = Field(default_factory=list)
    config: RunConfig = Field(default_factory=RunConfig)
    tools: dict[str, ToolMeta] = Field(default_factory=dict)
    features: HostFeatures = Field(default_factory=HostFeatures)
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
    answer cut short, ``tool_use`` when ``max_turns`` ended the run, ... ``None`` in runs
    recorded before it was reported."""


class AgentProgress(BaseModel):
    """The ``progress`` query of ``AgentRunWorkflow``."""

    run_id: str
    turn_index: int
    turns: list[str]
    usage: Usage
    status: Literal["model", "tools", "done"]


# -- the dispatch record on the wire ------------------------------------------------------

DISPATCH_FIELDS = (
    "call_id",
    "attempt",
    "tool_name",
    "tool_kind",
    "principal_id",
    "raw_arguments",
    "ignored_arguments",
    "effective_arguments",
    "idempotency_key",
    "status",
    "text",
    "value",
    "source_call_id",
    "lease_lost",
    "started_at",
    "finished_at",
)
"""The fields of ``tooltrail.dispatcher.DispatchRecord``, in order (a test keeps them equal)."""


def _implied_dispatch(
    *, call_id: str, attempt: int, tool_name: str, arguments: dict[str, Any], output: Any
) -> dict[str, Any]:
    # What the workflow knows of a dispatch record before the activity runs: the activity
    # leaves these out of its outcome when they hold, so the history does not carry them
    # twice. The record counts attempts from 1, the workflow from 0.
    implied: dict[str, Any] = {
        "call_id": call_id,
        "attempt": attempt + 1,
        "tool_name": tool_name,
        "tool_kind": "static",
        "principal_id": None,
        "raw_arguments": arguments,
        "ignored_arguments": [],
        "effective_arguments": canonical_json(arguments),
        "idempotency_key": None,
        "status": "ok",
        "text": None,
        "source_call_id": None,
        "lease_lost": False,
    }
    if isinstance(output, str):
        implied["value"] = output
    return implied


def pack_dispatch(
    record: dict[str, Any],
    *,
    call_id: str,
    attempt: int,
    tool_name: str,
    arguments: dict[str, Any],
    output: Any,
) -> dict[str, Any]:
    """Drop from a dispatch record (JSON form) what ``unpack_dispatch`` can put back.

    Args:
        record: ``DispatchRecord.model_dump(mode="json")``, possibly with extra keys.
        call_id: the attempt's tool call id.
        attempt: the workflow's attempt number (from 0).
        tool_name: the tool the attempt ran.
        arguments: the arguments the workflow sent.
        output: the attempt's output as the outcome carries it.
    """
    implied = _implied_dispatch(
        call_id=call_id, attempt=attempt, tool_name=tool_name, arguments=arguments, output=output
    )
    return {k: v for k, v in record.items() if k not in implied or v != implied[k]}


def unpack_dispatch(
    packed: dict[str, Any],
    *,
    call_id: str,
    attempt: int,
    tool_name: str,
    arguments: dict[str, Any],
    output: Any,
) -> dict[str, Any]:
    """The whole dispatch record again, in field order (a full record comes back as is)."""
    implied = _implied_dispatch(
        call_id=call_id, attempt=attempt, tool_name=tool_name, arguments=arguments, output=output
    )
    full = {
        k: packed[k] if k in packed else implied[k]
        for k in DISPATCH_FIELDS
        if k in packed or k in implied
    }
    full.update((k, v) for k, v in packed.items() if k not in full)
    return full


# -- attempt timestamps on the wire -------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICRO


def _moment(micros: int) -> datetime:
    return _EPOCH + micros * _MICRO


def _iso_z(moment: datetime) -> str:
    # The form pydantic gives a UTC datetime in JSON (the dispatch record's timestamps).
    fraction = f".{moment.microsecond:06d}" if moment.microsecond else ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def _exact_micros(text: Any) -> int | None:
    """Microseconds of an ISO text that ``_iso_z`` writes back exactly; else ``None``."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.utcoffset() != timedelta(0) or _iso_z(moment) != text:
        return None
    return _micros(moment)


def _pack_times(outcome: AttemptOutcome, data: dict[str, Any]) -> list[int] | None:
    """The outcome's times as ``AttemptOutcome._pack`` lists them.

    The dispatch record's two leave ``data`` when they pack exactly.
    """
    started, finished = outcome.started_at, outcome.finished_at
    if started is None or finished is None or started.utcoffset() != timedelta(0):
        return None
    if finished.utcoffset() != timedelta(0):
        return None
    duration = round(outcome.duration_ms * 1000)
    if duration / 1000 != outcome.duration_ms:
        return None  # more digits than microseconds: keep the float as it is
    base = _micros(started)
    times = [base, _micros(finished) - base, duration]
    dispatch = data.get("dispatch")
    if isinstance(dispatch, dict):
        begun = _exact_micros(dispatch.get("started_at"))
        ended = _exact_micros(dispatch.get("finished_at"))
        if begun is not None and ended is not None:
            data["dispatch"] = {
                k: v for k, v in dispatch.items() if k not in ("started_at", "finished_at")
            }
            times += [begun - base, ended - base]
    return times


def _unpack_times(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    base, finished, duration, *dispatch_times = data.pop("t")
    data["started_at"] = _moment(base)
    data["finished_at"] = _moment(base + finished)
    data["duration_ms"] = duration / 1000
    if dispatch_times and isinstance(data.get("dispatch"), dict):
        begun, ended = dispatch_times
        data["dispatch"] = {
            **data["dispatch"],
            "started_at": _iso_z(_moment(base + begun)),
            "finished_at": _iso_z(_moment(base + ended)),
        }
    return data
