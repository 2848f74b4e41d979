"""Workflows: deterministic code only; checked by replay tests over ``tests/histories/``."""

from workflows.agent import AgentRunWorkflow
from workflows.session import CloseSessionWorkflow
from workflows.turn import TurnWorkflow

__all__ = ["AgentRunWorkflow", "CloseSessionWorkflow", "TurnWorkflow"]
