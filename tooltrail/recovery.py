"""Recovery: what a reflector says about a failure, and what a strategy decides to do.

Strategies are pydantic models evaluated inside the turn workflow, so ``decide`` must stay
pure and deterministic. Reflectors are host-wired user code (they may ask a model) and run
worker-side; only their ``Analysis`` reaches the workflow.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, model_validator

__all__ = [
    "MAX_RECOVERY_ATTEMPTS",
    "Action",
    "AlwaysRecoverable",
    "Analysis",
    "AskUser",
    "Correction",
    "ExponentialBackoff",
    "Fail",
    "FixedDelay",
    "InputFix",
    "NoRetry",
    "NoopReflector",
    "RecoveryStrategy",
    "ReflectionContext",
    "Reflector",
    "Retry",
    "RetryForever",
    "Severity",
    "Skip",
    "ToolChange",
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


Correction = Annotated[InputFix | ToolChange, Field(discriminator="kind")]


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


RecoveryStrategy = Annotated[
    ExponentialBackoff | FixedDelay | RetryForever | NoRetry, Field(discriminator="kind")
]
"""Any recovery strategy; stored in ``RunConfig.recovery``."""
