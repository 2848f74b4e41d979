"""Recovery: what a reflector says about a failure, and what a strategy decides to do.

Strategies are pydantic models evaluated inside the turn workflow, so ``decide`` must stay
pure and deterministic. Reflectors are host-wired user code (they may ask a model) and run
worker-side; only their ``Analysis`` reaches the workflow.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import asdict, is_dataclass
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, TypeAdapter, model_validator

__all__ = [
    "BUILTIN_STRATEGIES",
    "MAX_RECOVERY_ATTEMPTS",
    "Action",
    "AlwaysRecoverable",
    "Analysis",
    "ApproachChange",
    "AskUser",
    "Correction",
    "CustomStrategy",
    "Escalate",
    "ExponentialBackoff",
    "Fail",
    "FixedDelay",
    "InputFix",
    "NoRetry",
    "NoopReflector",
    "PrerequisiteFix",
    "RecoveryStrategy",
    "ReflectionContext",
    "Reflector",
    "Retry",
    "RetryForever",
    "Severity",
    "Skip",
    "Strategy",
    "ToolChange",
    "as_strategy",
]

MAX_RECOVERY_ATTEMPTS = 5
"""Retries allowed per call whatever the strategy says: at most six executions (spec §6.3)."""

Severity = Literal["low", "medium", "high", "critical"]
_SEVERITY_RANK: dict[str, int] = {"low": 0, "medium": 1, "high": 2, "critical": 3}


class InputFix(BaseModel):
    """Correction: retry with a different input (must be a JSON object)."""

    kind: Literal["input_fix"] = "input_fix"
    modified_input: Any = None
    """The replacement input."""

    def __init__(self, modified_input: Any = None, /, **data: Any) -> None:
        """Create a correction: ``InputFix({"path": "/ok"})`` or with keywords."""
        if modified_input is not None:
            data["modified_input"] = modified_input
        super().__init__(**data)


class ToolChange(BaseModel):
    """Correction: retry with a different tool."""

    kind: Literal["tool_change"] = "tool_change"
    alternative_tool: str | None = None
    """The tool to call instead."""

    def __init__(self, alternative_tool: str | None = None, /, **data: Any) -> None:
        """Create a correction: ``ToolChange("search")`` or with keywords."""
        if alternative_tool is not None:
            data["alternative_tool"] = alternative_tool
        super().__init__(**data)


class PrerequisiteFix(BaseModel):
    """Correction: something must happen first. The engine retries the call unchanged."""

    kind: Literal["prerequisite_fix"] = "prerequisite_fix"
    prerequisite: str = ""
    """What must happen first (recorded; the call itself is not changed)."""

    def __init__(self, prerequisite: str | None = None, /, **data: Any) -> None:
        """Create a correction: ``PrerequisiteFix("create the folder")`` or with keywords."""
        if prerequisite is not None:
            data["prerequisite"] = prerequisite
        super().__init__(**data)


class ApproachChange(BaseModel):
    """Correction: try another way. The engine retries the call unchanged."""

    kind: Literal["approach_change"] = "approach_change"
    approach: str = ""
    """The suggested approach (recorded; the call itself is not changed)."""

    def __init__(self, approach: str | None = None, /, **data: Any) -> None:
        """Create a correction: ``ApproachChange("search first")`` or with keywords."""
        if approach is not None:
            data["approach"] = approach
        super().__init__(**data)


class Escalate(BaseModel):
    """Correction: a human should look. The engine retries the call unchanged.

    It never waits for anyone; a strategy that wants to stop returns ``AskUser`` or ``Fail``.
    """

    kind: Literal["escalate"] = "escalate"
    reason: str = ""
    """Why (recorded; the call itself is not changed)."""

    def __init__(self, reason: str | None = None, /, **data: Any) -> None:
        """Create a correction: ``Escalate("needs a human")`` or with keywords."""
        if reason is not None:
            data["reason"] = reason
        super().__init__(**data)


Correction = Annotated[
    InputFix | ToolChange | PrerequisiteFix | ApproachChange | Escalate,
    Field(discriminator="kind"),
]
"""What a reflector may suggest (spec §6.4): ``InputFix`` and ``ToolChange`` change the next
attempt; ``PrerequisiteFix``, ``ApproachChange`` and ``Escalate`` are recorded and skipped."""


with warnings.catch_warnings():
    # The contract's field name is ``schema``, which shadows pydantic's deprecated
    # ``BaseModel.schema()`` classmethod: on an instance the field wins, which is the point.
    warnings.filterwarnings("ignore", message='Field name "schema"', category=UserWarning)

    class ReflectionContext(BaseModel):
        """What a reflector is told about a failed attempt."""

        error: str
        """The failed attempt's output, rendered to text."""
        tool: str
        """The tool name this attempt requested."""
        arguments: dict[str, Any]
        """This attempt's input."""
        schema: dict[str, Any] | None = None  # type: ignore[assignment]
        """The tool's parameter schema, when known."""
        attempt: int
        """The 0-based attempt index."""
        max_attempts: int = MAX_RECOVERY_ATTEMPTS
        """The engine's retry ceiling."""
        task: str = ""
        """The task the agent works on, when known."""

        @model_validator(mode="before")
        @classmethod
        def _old_schema_name(cls, data: Any) -> Any:
            # ``schema_=`` (the name before 0.2) is still accepted.
            if isinstance(data, dict) and "schema_" in data and "schema" not in data:
                data = {**data, "schema": data["schema_"]}
                del data["schema_"]
            return data

        @property
        def schema_(self) -> dict[str, Any] | None:
            """Deprecated alias of ``schema`` (its name before 0.2)."""
            return self.schema


class Analysis(BaseModel):
    """A reflector's judgement of a failure."""

    is_recoverable: bool
    """Whether retrying can help."""
    root_cause: str
    """What went wrong."""
    severity: Severity = "medium"
    """How bad it is."""
    correction: Correction | None = None
    """A change to apply before the retry."""
    context: str = ""
    """Free text for logs and the audit trail."""


@runtime_checkable
class Reflector(Protocol):
    """Judges failed attempts; runs worker-side and may do I/O."""

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        """Return the analysis of a failed attempt."""
        ...


class NoopReflector:
    """The default reflector: nothing is recoverable, so every call runs exactly once."""

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        """Return a non-recoverable analysis whose root cause is the error text."""
        return Analysis(is_recoverable=False, root_cause=ctx.error)


class AlwaysRecoverable:
    """A reflector that marks every failure recoverable, without a correction."""

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        """Return a recoverable analysis whose root cause is the error text."""
        return Analysis(is_recoverable=True, root_cause=ctx.error)


class Retry(BaseModel):
    """Action: run the call again after ``delay_ms``."""

    kind: Literal["retry"] = "retry"
    delay_ms: int = 0


class Skip(BaseModel):
    """Action: give up softly (the reason is never shown to the model)."""

    kind: Literal["skip"] = "skip"
    reason: str = ""


class AskUser(BaseModel):
    """Action: give up softly, suggesting a human look (never waits for one)."""

    kind: Literal["ask_user"] = "ask_user"
    prompt: str = ""


class Fail(BaseModel):
    """Action: give up softly."""

    kind: Literal["fail"] = "fail"
    reason: str = ""


Action = Annotated[Retry | Skip | AskUser | Fail, Field(discriminator="kind")]


def _saturating_delay(base_ms: int, attempt: int, cap_ms: int) -> int:
    # Python ints do not overflow, but a huge shift is wasted work: stop once past the cap.
    if attempt >= 63:
        return cap_ms if base_ms > 0 else 0
    return min(base_ms * (1 << attempt), cap_ms)


class ExponentialBackoff(BaseModel):
    """Retry recoverable failures with doubling delays (the default strategy, spec §6.2)."""

    kind: Literal["exponential_backoff"] = "exponential_backoff"
    max_retries: int = Field(default=3, ge=0)
    base_delay_ms: int = Field(default=100, ge=0)
    max_delay_ms: int = Field(default=30_000, ge=0)

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Action:
        """Apply the rules of spec §6.2; the first match wins."""
        mr = min(self.max_retries, max_attempts)
        if not analysis.is_recoverable:
            return Fail(reason=analysis.root_cause)
        if attempt >= mr:
            return Fail(reason=f"max retries ({mr}) exceeded")
        if _SEVERITY_RANK[analysis.severity] >= _SEVERITY_RANK["high"] and analysis.correction:
            return AskUser(
                prompt=f"high-severity failure with correction available: {analysis.root_cause}"
            )
        return Retry(delay_ms=_saturating_delay(self.base_delay_ms, attempt, self.max_delay_ms))


class FixedDelay(BaseModel):
    """Retry recoverable failures after the same delay each time."""

    kind: Literal["fixed_delay"] = "fixed_delay"
    max_retries: int = Field(ge=0)
    delay_ms: int = Field(ge=0)

    def __init__(
        self, max_retries: int | None = None, delay_ms: int | None = None, /, **data: Any
    ) -> None:
        """Create the strategy: ``FixedDelay(3, 500)`` or with keywords."""
        if max_retries is not None:
            data["max_retries"] = max_retries
        if delay_ms is not None:
            data["delay_ms"] = delay_ms
        super().__init__(**data)

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Action:
        """Fail when not recoverable or out of retries, else retry after ``delay_ms``."""
        mr = min(self.max_retries, max_attempts)
        if not analysis.is_recoverable:
            return Fail(reason=analysis.root_cause)
        if attempt >= mr:
            return Fail(reason=f"max retries ({mr}) exceeded")
        return Retry(delay_ms=self.delay_ms)


class RetryForever(BaseModel):
    """Always retry; only the engine's ceiling (``MAX_RECOVERY_ATTEMPTS``) stops it."""

    kind: Literal["retry_forever"] = "retry_forever"
    delay_ms: int = Field(default=0, ge=0)

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Action:  # noqa: ARG002 - the strategy signature
        """Return ``Retry(delay_ms)`` whatever happened."""
        return Retry(delay_ms=self.delay_ms)


class NoRetry(BaseModel):
    """Never retry."""

    kind: Literal["no_retry"] = "no_retry"

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Action:  # noqa: ARG002 - the strategy signature
        """Return ``Fail(root_cause)``."""
        return Fail(reason=analysis.root_cause)


@runtime_checkable
class Strategy(Protocol):
    """Any recovery strategy: an object with a deterministic ``decide``.

    ``decide`` runs in the turn workflow, so it is *workflow code*: pure and deterministic
    (no I/O, clock, randomness or global state; the same analysis, attempt and ceiling give
    the same action on every replay). Its module is imported inside Temporal's sandbox on
    the worker, so it must be importable there and its class defined at module level.
    """

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Action:
        """Return the action after the failed attempt ``attempt`` (0-based)."""
        ...


_ACTION: TypeAdapter[Action] = TypeAdapter(Action)


class CustomStrategy(BaseModel):
    """A user's strategy as ``RunConfig`` carries it: its class and its state.

    ``RunConfig(recovery=MyStrategy(...))`` builds it from the object: ``path`` names the
    class (``module:QualName``) and ``options`` its state (a pydantic model's fields, a
    dataclass's fields, or else the instance's attributes), all JSON. The workflow rebuilds
    the object from them and calls its ``decide``. A ``decide`` that raises or returns no
    action gives ``Fail`` with the reason (a turn must not hang on a bad strategy).
    """

    kind: Literal["custom"] = "custom"
    path: str
    """``module:QualName`` of the strategy's class."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The strategy's state."""

    @classmethod
    def of(cls, strategy: Any) -> CustomStrategy:
        """Describe ``strategy`` (any object with ``decide``) so a workflow can rebuild it.

        Raises:
            ValueError: it has no ``decide``, or its class is not defined at module level.
        """
        if not callable(getattr(strategy, "decide", None)):
            raise ValueError(f"a recovery strategy needs a decide method: {strategy!r}")
        kind = type(strategy)
        if "<locals>" in kind.__qualname__:
            raise ValueError(
                f"recovery strategy class {kind.__qualname__!r} must be defined at module "
                "level (the workflow imports it)"
            )
        options: dict[str, Any]
        if isinstance(strategy, BaseModel):
            options = strategy.model_dump(mode="json")
        elif is_dataclass(strategy) and not isinstance(strategy, type):
            options = asdict(strategy)
        else:
            options = dict(vars(strategy))
        return cls(path=f"{kind.__module__}:{kind.__qualname__}", options=options)

    def build(self) -> Any:
        """Import the class and rebuild the strategy from ``options``."""
        module_name, _, qualname = self.path.partition(":")
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        if isinstance(target, type) and issubclass(target, BaseModel):
            return target.model_validate(self.options)
        if isinstance(target, type) and is_dataclass(target):
            return target(**self.options)
        built = target.__new__(target)
        built.__dict__.update(self.options)
        return built

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Action:
        """Rebuild the strategy and let it decide; a broken one gives ``Fail`` (soft)."""
        try:
            action = self.build().decide(analysis, attempt, max_attempts)
            if isinstance(action, Retry | Skip | AskUser | Fail):
                return action
            return _ACTION.validate_python(action)
        except Exception as exc:  # user code: its failure is the call's, never the turn's
            return Fail(reason=f"recovery strategy error ({type(exc).__name__}): {exc}")


BUILTIN_STRATEGIES = (ExponentialBackoff, FixedDelay, RetryForever, NoRetry, CustomStrategy)
"""The strategy models ``RunConfig.recovery`` holds as they are; any other object with a
``decide`` is carried as a ``CustomStrategy``."""


def as_strategy(value: Any) -> Any:
    """``RunConfig.recovery``'s input: built-ins and JSON as they are, other objects described.

    Raises:
        ValueError: an object without ``decide``, or of a class not at module level.
    """
    if value is None or isinstance(value, (dict, *BUILTIN_STRATEGIES)):
        return value
    return CustomStrategy.of(value)


RecoveryStrategy = Annotated[
    ExponentialBackoff | FixedDelay | RetryForever | NoRetry | CustomStrategy,
    Field(discriminator="kind"),
]
"""Any recovery strategy; stored in ``RunConfig.recovery``."""
