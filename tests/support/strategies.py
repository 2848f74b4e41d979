"""Recovery strategies of users' own (workflow code: imported inside the sandbox)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from tooltrail import Analysis, Fail, Retry, Skip


class SkipAfter(BaseModel):
    """Retries ``retries`` times, then skips (a pydantic strategy)."""

    retries: int = 1

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Retry | Skip:
        """Retry at once until ``retries`` retries ran, then skip."""
        if attempt < min(self.retries, max_attempts):
            return Retry(delay_ms=0)
        return Skip(reason=f"skipped after {attempt + 1} executions: {analysis.root_cause}")


@dataclass
class FailWith:
    """Fails with a fixed reason (a dataclass strategy)."""

    reason: str

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Fail:
        """Always fail with ``reason``."""
        return Fail(reason=self.reason)


class Broken:
    """A plain class whose decide raises."""

    def __init__(self) -> None:
        self.note = "broken"

    def decide(self, analysis: Analysis, attempt: int, max_attempts: int) -> Fail:
        """Raise."""
        raise ValueError(self.note)
