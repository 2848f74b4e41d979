"""The same tool script through Pydantic AI's Temporal integration and through tooltrail.

Both run an agent loop on the same embedded dev server, with a scripted model (no network)
that asks for a no-op tool K times (K = 1, 10, 50) and then answers:

- loop: one tool call per model response, K + 1 model requests (model, tool, model, ...);
- batch: one model response with K tool calls, run concurrently, then the answer.

Pydantic AI: ``Agent(FunctionModel(...), capabilities=[TemporalDurability()])`` run by
``agent.run()`` inside a workflow listed with ``__pydantic_ai_agents__``, a client with
``PydanticAIPlugin`` (its worker registers the agent's model and tool activities). One
workflow per run.

tooltrail: ``tt.run_agent`` with ``ScriptedModel`` (the same script, as a function of the
request): an ``AgentRunWorkflow`` whose every model turn is a child ``TurnWorkflow`` (a model
activity, one activity per tool attempt, the audit record); batch turns use parallel
dispatch. Its history is the run's (every continue-as-new segment) plus its turns'.

Columns: wall time per tool call (median run / K), history bytes, events and activities per
tool call, and tooltrail / Pydantic AI; "tt local" runs the same no-op tool declared
``@tool(local=True)`` and asks the model in a local activity (``local_model=True``), the two
opt-in fast paths (Pydantic AI can likewise run a tool inside its workflow; the peer here
keeps its default, an activity per model request and per tool call). Both workers use
Temporal's sandbox with the benchmark's own modules passed through. Needs
``pydantic-ai-slim[temporal]`` (not a tooltrail dependency): without it the benchmark says so
and skips.
Run: ``python -m bench.peer``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench.common import HistorySize, console, embedded, history_size, median, report
from tooltrail import Host, RunConfig, Tooltrail, tool
from tooltrail.core.messages import ModelRequest as TTModelRequest
from tooltrail.core.messages import ModelResponse as TTModelResponse
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

KS = (1, 10, 50)
SHAPES = ("loop", "batch")
REPEAT = {1: 5, 10: 3, 50: 2}
SKIP_REASON: str | None = None

try:
    from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.durable_exec.temporal import (
        PydanticAIPlugin,
        PydanticAIWorkflow,
        TemporalDurability,
    )
    from pydantic_ai.messages import ModelRequest, ToolReturnPart, UserPromptPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import UsageLimits
except ImportError as exc:  # pragma: no cover - depends on the environment
    SKIP_REASON = (
        f"pydantic-ai's Temporal integration is not installed ({exc}); "
        'install it with: .venv/bin/pip install "pydantic-ai-slim[temporal]"'
    )


def parse_prompt(prompt: str) -> tuple[str, int]:
    """``"loop 10"`` (or ``"loop 10 local"``) -> ``("loop", 10)``."""
    shape, k = prompt.split()[:2]
    return shape, int(k)


if SKIP_REASON is None:

    def peer_script(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        """The scripted model: K tool calls (one per response, or all in one), then text."""
        prompt = next(
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, UserPromptPart)
        )
        shape, k = parse_prompt(str(prompt))
        done = sum(
            isinstance(part, ToolReturnPart)
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
        )
        if done >= k:
            return ModelResponse(parts=[TextPart(f"done {done}")])
        wanted = range(done, done + 1) if shape == "loop" else range(k)
        return ModelResponse(
            parts=[ToolCallPart("nothing", {"text": f"c{i}"}, tool_call_id=f"c{i}") for i in wanted]
        )

    peer_agent = Agent(
        FunctionModel(peer_script),
        name="bench_peer",
        capabilities=[TemporalDurability()],
    )

    @peer_agent.tool_plain
    async def nothing(text: str) -> str:
        """Return the text."""
        return text

    @workflow.defn(name="BenchPeerWorkflow")
    class PeerWorkflow(PydanticAIWorkflow):
        """One agent run."""

        __pydantic_ai_agents__ = (peer_agent,)

        @workflow.run
        async def run(self, prompt: str) -> str:
            """Run the agent on the prompt; return its answer."""
            # The default limit (50 model requests) would stop the K=50 loop.
            result = await peer_agent.run(prompt, usage_limits=UsageLimits(request_limit=1000))
            return result.output


@tool(name="nothing", concurrent_safe=True)
async def nothing_tt(text: str) -> str:
    """Return the text."""
    return text


@tool(name="nothing_local", concurrent_safe=True, local=True)
async def nothing_local(text: str) -> str:
    """Return the text (a local activity)."""
    return text


def tooltrail_step(request: TTModelRequest) -> TTModelResponse:
    """The same script for tooltrail's model client (``local`` in the prompt: the local tool)."""
    prompt = next(m.content for m in request.messages if m.role == "user")
    shape, k = parse_prompt(prompt)
    name = "nothing_local" if prompt.endswith(" local") else "nothing"
    done = sum(m.role == "tool" for m in request.messages)
    if done >= k:
        return text_response(f"done {done}")
    wanted = range(done, done + 1) if shape == "loop" else range(k)
    return tool_call_response(*[(f"c{i}", name, {"text": f"c{i}"}) for i in wanted])


def model_requests() -> int:
    """How many model requests the whole benchmark makes on the tooltrail side."""
    per_run = {("loop", k): k + 1 for k in KS} | {("batch", k): 2 for k in KS}
    once = sum(REPEAT[k] * (per_run[shape, k]) for shape, k in per_run) + sum(per_run.values())
    return 2 * once  # the plain tool and the local one


def sandbox() -> SandboxedWorkflowRunner:
    """The sandbox with this benchmark's modules passed through (as tooltrail's worker does)."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("bench", "tooltrail")
    )


async def measure(
    run: Callable[[str], Any], size: Callable[[Any], Any], shape: str, k: int, suffix: str = ""
) -> tuple[float, HistorySize]:
    """Median wall ms of ``REPEAT[k]`` runs (after a warm-up run) and the last run's size."""
    prompt = f"{shape} {k}{suffix}"
    await run(prompt)
    samples = []
    last = None
    for _ in range(REPEAT[k]):
        started = time.perf_counter()
        last = await run(prompt)
        samples.append((time.perf_counter() - started) * 1000)
    return median(samples), await size(last)


async def main() -> None:
    if SKIP_REASON is not None:
        console.print(f"peer skipped: {SKIP_REASON}", style="yellow", markup=False)
        return
    host = Host(
        [nothing_tt, nothing_local], model=ScriptedModel([tooltrail_step] * model_requests())
    )
    rows = []
    async with embedded(host) as tt:
        peer_client = Client(
            tt.client.service_client,
            namespace=tt.client.namespace,
            plugins=[PydanticAIPlugin()],
        )
        queue = f"peer-{uuid.uuid4()}"
        async with Worker(
            peer_client, task_queue=queue, workflows=[PeerWorkflow], workflow_runner=sandbox()
        ):
            for shape in SHAPES:
                config = RunConfig(dispatch="parallel", max_concurrency=max(KS))
                for k in KS:
                    peer_ms, peer_size = await measure(
                        lambda prompt: run_peer(peer_client, queue, prompt),
                        lambda workflow_id: history_size(peer_client, workflow_id),
                        shape,
                        k,
                    )
                    tt_ms, tt_size = await measure(
                        lambda prompt, config=config: run_tooltrail(tt, prompt, config),
                        lambda turns: tooltrail_size(tt, turns),
                        shape,
                        k,
                    )
                    local_ms, _ = await measure(
                        lambda prompt, config=config: run_tooltrail(
                            tt, prompt, config, local_model=True
                        ),
                        lambda turns: tooltrail_size(tt, turns),
                        shape,
                        k,
                        " local",
                    )
                    rows.append(
                        [
                            f"{shape}, K={k}",
                            REPEAT[k],
                            peer_ms / k,
                            tt_ms / k,
                            tt_ms / peer_ms,
                            local_ms / k,
                            local_ms / peer_ms,
                            round(peer_size.size / k),
                            round(tt_size.size / k),
                            tt_size.size / peer_size.size,
                            peer_size.events / k,
                            tt_size.events / k,
                            peer_size.activities / k,
                            tt_size.activities / k,
                        ]
                    )
    report(
        "peer",
        [
            "script",
            "runs",
            "pydantic-ai ms/call",
            "tooltrail ms/call",
            "ms tt/pai",
            "tt local ms/call",
            "ms local/pai",
            "pai bytes/call",
            "tt bytes/call",
            "bytes tt/pai",
            "pai events/call",
            "tt events/call",
            "pai act/call",
            "tt act/call",
        ],
        rows,
        {
            "repeat": REPEAT,
            "peer": peer_version(),
            "tooltrail_shape": "tt.run_agent + ScriptedModel (AgentRunWorkflow + TurnWorkflows)",
        },
    )


async def run_peer(client: Client, queue: str, prompt: str) -> str:
    """One Pydantic AI agent run; returns its workflow id."""
    workflow_id = f"peer-{uuid.uuid4()}"
    answer = await client.execute_workflow(
        "BenchPeerWorkflow",
        prompt,
        id=workflow_id,
        task_queue=queue,
        result_type=str,
        request_eager_start=True,  # started as tooltrail starts a run
    )
    expected = f"done {parse_prompt(prompt)[1]}"
    if answer != expected:
        raise RuntimeError(f"pydantic-ai run {workflow_id}: {answer!r}, expected {expected!r}")
    return workflow_id


async def run_tooltrail(
    tt: Tooltrail, prompt: str, config: RunConfig, *, local_model: bool = False
) -> tuple[str, list[str]]:
    """One tooltrail agent run; returns its run id and turn ids."""
    result = await tt.run_agent(
        prompt,
        session_id=f"bench-{uuid.uuid4()}",
        config=config,
        max_turns=100,
        local_model=local_model,
    )
    expected = f"done {parse_prompt(prompt)[1]}"
    if result.text != expected:
        raise RuntimeError(f"tooltrail run {result.run_id}: {result.text!r}, expected {expected!r}")
    return result.run_id, result.turns


async def tooltrail_size(tt: Tooltrail, run: tuple[str, list[str]]) -> HistorySize:
    """The run's history (all segments) plus every turn's."""
    run_id, turns = run
    sizes = [await history_size(tt.client, run_id)]
    sizes += [await history_size(tt.client, turn_id) for turn_id in turns]
    return HistorySize(*(sum(column) for column in zip(*sizes, strict=True)))


def peer_version() -> str:
    """The installed pydantic-ai-slim version."""
    from importlib.metadata import version

    return f"pydantic-ai-slim {version('pydantic-ai-slim')}"


if __name__ == "__main__":
    asyncio.run(main())
