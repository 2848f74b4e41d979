"""Traces on a real Temporal server, the tool metrics, the env-driven SDK setup, and logging."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

import tooltrail
from tooltrail import (
    AlwaysRecoverable,
    Block,
    FixedDelay,
    Host,
    PreToolUseContext,
    RunConfig,
    ToolCall,
    ToolContext,
    tool,
)
from tooltrail.client import Tooltrail
from tooltrail.core.wire import TOOL_EXECUTE
from tooltrail.db.store import AuditStore
from tooltrail.errors import ToolError
from tooltrail.llm import ScriptedModel, Usage, text_response, tool_call_response
from tooltrail.logs import (
    JsonFormatter,
    SecretFilter,
    call_context,
    configure_logging,
    current_call,
)
from tooltrail.runtime.worker import build_worker, connect_client
from tooltrail.settings import Settings
from tooltrail.telemetry import (
    ToolMetrics,
    configure_from_env,
    ensure_configured,
    record_breaker_state,
    record_call,
    record_retry,
    tracing_interceptors,
    use_meter_provider,
    use_tracer_provider,
)
from tooltrail.tools.scratch import ScratchDirs

# -- traces: turn → attempt ----------------------------------------------------------------------

# (tool call id, attempt, span id of the span current in the tool body)
seen_spans: list[tuple[str, int, int]] = []


def _note_span(ctx: ToolContext) -> None:
    seen_spans.append(
        (ctx.tool_call_id, ctx.attempt, trace.get_current_span().get_span_context().span_id)
    )


@tool
def wobbly(ctx: ToolContext) -> str:
    """Fail the first attempt, succeed the second."""
    _note_span(ctx)
    if ctx.attempt == 0:
        raise ToolError("first attempt fails")
    return "second time lucky"


@tool
def steady(ctx: ToolContext) -> str:
    """Always succeed."""
    _note_span(ctx)
    return "fine"


def ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names = []
    parent = span.parent
    while parent is not None and parent.span_id in by_id:
        found = by_id[parent.span_id]
        names.append(found.name)
        parent = found.parent
    return names


@pytest.mark.parametrize("max_cached_workflows", [1000, 0], ids=["sticky", "replay-every-task"])
async def test_turn_span_is_the_ancestor_of_one_activity_span_per_attempt(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path, max_cached_workflows: int
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # tooltrail's spans and the interceptor's (built without a provider) both go there.
    use_tracer_provider(provider)
    client: Client = await connect_client(
        temporal_env.client.service_client.config.target_host,
        namespace=temporal_env.client.namespace,
        interceptors=tracing_interceptors(),
    )
    host = Host([wobbly, steady], reflector=AlwaysRecoverable())
    store = AuditStore(sqlite_url)
    task_queue = f"tq-{uuid.uuid4()}"
    tt = Tooltrail(client, host, task_queue=task_queue, store=store)
    seen_spans.clear()
    try:
        # The interceptors come from the client: a worker built on it uses them too
        # (passing them again through build_worker would open every span twice).
        async with build_worker(
            client,
            host,
            task_queue=task_queue,
            store=store,
            scratch=ScratchDirs(tmp_path / "scratch"),
            # 0: every workflow task replays the history so far; spans must not repeat.
            max_cached_workflows=max_cached_workflows,
        ):
            turn = await tt.run_turn(
                [ToolCall("a", "wobbly", {}), ToolCall("b", "steady", {})],
                session_id="otel",
                config=RunConfig(recovery=FixedDelay(1, 0)),
            )
    finally:
        await store.close()
        use_tracer_provider(None)
    provider.force_flush()
    spans = list(exporter.get_finished_spans())
    by_id = {span.context.span_id: span for span in spans}

    assert [(r.tool_call_id, r.is_error, r.output) for r in turn.results] == [
        ("a", False, "second time lucky"),
        ("b", False, "fine"),
    ]
    assert sorted((call, attempt) for call, attempt, _ in seen_spans) == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]

    [start] = [s for s in spans if s.name == "StartWorkflow:TurnWorkflow"]
    [run] = [s for s in spans if s.name == "RunWorkflow:TurnWorkflow"]
    assert start.attributes is not None and start.attributes["temporalWorkflowID"] == turn.turn_id
    assert run.parent is not None and run.parent.span_id == start.context.span_id

    attempts = [s for s in spans if s.name == f"RunActivity:{TOOL_EXECUTE}"]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    # One activity span per attempt, each with one span named after its tool, and that is
    # the span the tool body ran in: none repeated when the workflow replays.
    assert len(attempts) == 3
    assert sorted(s.name for s in tools) == [
        "execute_tool steady",
        "execute_tool wobbly",
        "execute_tool wobbly",
    ]
    assert {s.context.span_id for s in tools} == {span_id for _, _, span_id in seen_spans}
    for span in tools:
        assert span.context.trace_id == start.context.trace_id
        # Temporal's interceptor hangs the workflow's (zero-length) spans, RunWorkflow and
        # each StartActivity, directly under the client's span of the turn.
        assert ancestors(span, by_id) == [
            f"RunActivity:{TOOL_EXECUTE}",
            f"StartActivity:{TOOL_EXECUTE}",
            "StartWorkflow:TurnWorkflow",
        ]
    by_attempt = {
        (s.attributes["gen_ai.tool.call.id"], s.attributes["tooltrail.attempt"]): s
        for s in tools
        if s.attributes is not None
    }
    assert sorted(by_attempt) == [("a", 0), ("a", 1), ("b", 0)]
    # The first attempt of "a" was a soft error: the span says so; the others succeeded.
    assert by_attempt[("a", 0)].status.status_code == StatusCode.ERROR
    assert by_attempt[("a", 1)].status.status_code == StatusCode.UNSET
    assert by_attempt[("b", 0)].status.status_code == StatusCode.UNSET
    assert len([s for s in spans if s.name == f"StartActivity:{TOOL_EXECUTE}"]) == 3
    # Nothing outside the turn's trace, nothing twice (the interceptor is installed once).
    assert {s.context.trace_id for s in spans} == {start.context.trace_id}
    assert len({s.context.span_id for s in spans}) == len(spans)


def test_tracing_interceptors_default_to_the_global_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [interceptor] = tracing_interceptors()
    # The global provider can be set once per process: stand one in where OpenTelemetry's
    # lookup reads it, installed after the interceptor was built.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    use_tracer_provider(None)
    with interceptor.tracer.start_as_current_span("probe"):
        pass
    [span] = exporter.get_finished_spans()
    assert span.name == "probe"
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "tooltrail"


# -- metrics -----------------------------------------------------------------------------------


def collected(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            assert scope.scope.name == "tooltrail"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value: Any = (
                        (point.count, point.sum)
                        if isinstance(point, HistogramDataPoint)
                        else getattr(point, "value", None)
                    )
                    out.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return out


def test_tool_metrics_record_calls_errors_retries_duration_and_breaker_state() -> None:
    reader = InMemoryMetricReader()
    metrics = ToolMetrics(MeterProvider(metric_readers=[reader]))
    metrics.record_call("search", False, 12.5)
    metrics.record_call("search", True, 7.5)
    metrics.record_call("fetch", False, 1.0)
    metrics.record_retry("search")
    metrics.record_breaker_state("search", "open")
    metrics.record_breaker_state("fetch", "closed")
    got = collected(reader)

    assert sorted((a["tool"], a["is_error"], v) for a, v in got["tooltrail.calls"]) == [
        ("fetch", False, 1),
        ("search", False, 1),
        ("search", True, 1),
    ]
    assert got["tooltrail.errors"] == [({"tool": "search"}, 1)]
    assert got["tooltrail.retries"] == [({"tool": "search"}, 1)]
    durations = {(a["tool"], a["is_error"]): v for a, v in got["tooltrail.call.duration"]}
    assert durations[("search", False)] == (1, 12.5)
    assert durations[("search", True)] == (1, 7.5)
    assert sorted((a["tool"], v) for a, v in got["tooltrail.breaker.state"]) == [
        ("fetch", 0),
        ("search", 2),
    ]
    with pytest.raises(ValueError, match="unknown breaker state 'ajar'"):
        metrics.record_breaker_state("search", "ajar")


def test_module_helpers_follow_use_meter_provider() -> None:
    reader = InMemoryMetricReader()
    use_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        record_call("t", True, 3.0)
        record_retry("t")
        record_breaker_state("t", "half_open")
    finally:
        use_meter_provider(None)
    got = collected(reader)
    assert got["tooltrail.calls"] == [({"tool": "t", "is_error": True}, 1)]
    assert got["tooltrail.retries"] == [({"tool": "t"}, 1)]
    assert got["tooltrail.breaker.state"] == [({"tool": "t"}, 1)]
    # Without a provider the helpers are no-ops, not errors.
    record_call("t", False, 1.0)


# -- configure_from_env --------------------------------------------------------------------------


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOOLTRAIL_OTEL_ENABLED", "true")
    return monkeypatch


def test_configure_from_env_is_off_unless_enabled(otel_env: pytest.MonkeyPatch) -> None:
    assert configure_from_env(Settings(otel_enabled=False), set_global=False) is None
    otel_env.setenv("OTEL_SDK_DISABLED", "true")
    assert configure_from_env(set_global=False) is None


def test_configure_from_env_reads_the_standard_variables(otel_env: pytest.MonkeyPatch) -> None:
    otel_env.setenv("OTEL_TRACES_EXPORTER", "console")
    otel_env.setenv("OTEL_METRICS_EXPORTER", "none")
    otel_env.setenv("OTEL_SERVICE_NAME", "agent-worker")
    telemetry = configure_from_env(set_global=False)
    assert telemetry is not None
    try:
        assert telemetry.trace_exporters == ("console",)
        assert telemetry.metric_exporters == ()
        assert telemetry.tracer_provider.resource.attributes["service.name"] == "agent-worker"
    finally:
        telemetry.shutdown()


def test_otlp_without_the_exporter_package_exports_nothing_and_warns(
    otel_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The default exporter is otlp; its package is not a dependency of tooltrail.
    caplog.set_level(logging.WARNING, logger="tooltrail.telemetry")
    telemetry = configure_from_env(set_global=False)
    assert telemetry is not None
    try:
        assert telemetry.trace_exporters == ()
        assert telemetry.metric_exporters == ()
        assert telemetry.tracer_provider.resource.attributes["service.name"] == "tooltrail"
    finally:
        telemetry.shutdown()
    assert "pip install opentelemetry-exporter-otlp" in caplog.text


# -- logging -------------------------------------------------------------------------------------

SECRET = "sk-test-4f9a8b7c6d5e"


@pytest.fixture
def log_stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """Configure JSON logging into a buffer; restore the root logger afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    monkeypatch.setenv("TOOLTRAIL_OPENAI_API_KEY", SECRET)
    stream = io.StringIO()
    configure_logging("json", "DEBUG", stream=stream)
    try:
        yield stream
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        # JSON mode switched Temporal's adapters to fields only; give other tests the default.
        workflow.logger.workflow_info_on_message = True
        activity.logger.activity_info_on_message = True


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_call_context(log_stream: io.StringIO) -> None:
    log = logging.getLogger("tooltrail.test")
    log.info("outside")
    with call_context("turn-1", "call-1", 2) as context:
        assert current_call() is context
        log.warning("inside %s", "the call")
    assert current_call() is None
    outside, inside = lines(log_stream)
    assert outside["message"] == "outside" and "turn_id" not in outside
    assert inside["message"] == "inside the call"
    assert inside["level"] == "WARNING" and inside["logger"] == "tooltrail.test"
    assert (inside["turn_id"], inside["tool_call_id"], inside["attempt"]) == ("turn-1", "call-1", 2)


async def test_activity_lines_carry_the_turn_from_activity_info(log_stream: io.StringIO) -> None:
    log = logging.getLogger("tooltrail.tool")

    @activity.defn(name="probe")
    async def probe() -> None:
        log.info("plain logger in an activity")
        with call_context(activity.info().workflow_id or "", "call-9", 0):
            activity.logger.info("activity logger")

    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, workflow_id="turn-77", workflow_type="TurnWorkflow", attempt=3
    )
    await env.run(probe)
    plain, adapted = lines(log_stream)
    assert (plain["turn_id"], plain["activity_attempt"]) == ("turn-77", 3)
    assert "tool_call_id" not in plain
    assert (adapted["turn_id"], adapted["tool_call_id"], adapted["attempt"]) == (
        "turn-77",
        "call-9",
        0,
    )
    # In JSON mode Temporal's adapter no longer appends its details to the message.
    assert adapted["message"] == "activity logger"


def test_workflow_extra_gives_the_turn_and_explicit_extras_win() -> None:
    record = logging.LogRecord("w", logging.INFO, __file__, 1, "step", None, None)
    record.temporal_workflow = {"workflow_id": "turn-5", "workflow_type": "TurnWorkflow"}
    record.tool_call_id = "c3"
    record.attempt = 1
    line = json.loads(JsonFormatter().format(record))
    assert (line["turn_id"], line["tool_call_id"], line["attempt"]) == ("turn-5", "c3", 1)
    other = logging.LogRecord("w", logging.INFO, __file__, 1, "bye", None, None)
    other.temporal_workflow = {"workflow_id": "close-1", "workflow_type": "CloseSessionWorkflow"}
    line = json.loads(JsonFormatter().format(other))
    assert "turn_id" not in line and line["workflow_id"] == "close-1"


def test_secrets_never_reach_the_output(log_stream: io.StringIO) -> None:
    log = logging.getLogger("tooltrail.test")
    log.info("calling with key %s", SECRET)
    log.info("request api_key=abc123 and Authorization: Bearer tok.en-1 done")
    log.info("db postgresql://app:hunter2@db:5432/x password=hunter2")
    try:
        raise RuntimeError(f"boom with {SECRET}")
    except RuntimeError:
        log.exception("failed")
    text = log_stream.getvalue()
    for leaked in (SECRET, "abc123", "tok.en-1", "hunter2"):
        assert leaked not in text
    first, second, third, failed = lines(log_stream)
    assert first["message"] == "calling with key ****"
    assert second["message"] == "request api_key=**** and Authorization: Bearer **** done"
    assert third["message"] == "db postgresql://app:****@db:5432/x password=****"
    assert "RuntimeError: boom with ****" in failed["exception"]


def test_text_format_and_reconfiguration(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        first = io.StringIO()
        configure_logging(
            "text", "INFO", settings=Settings(), stream=first, secrets=["s3cr3t-v4lue"]
        )
        second = io.StringIO()
        handler = configure_logging("text", "info", settings=Settings(), stream=second)
        assert [h for h in root.handlers if h.get_name() == "tooltrail"] == [handler]
        with call_context("turn-2", "c1", 0):
            logging.getLogger("x").info("hello password=pw")
        logging.getLogger("x").debug("hidden")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    assert first.getvalue() == ""
    [line] = second.getvalue().splitlines()
    assert line.endswith("INFO x: hello password=**** [turn_id=turn-2 tool_call_id=c1 attempt=0]")


def test_secret_filter_masks_known_values_longest_first() -> None:
    secret_filter = SecretFilter(["abcd", "abcdefgh", "xyz"])
    assert secret_filter.redact("abcdefgh abcd xyz") == "**** **** xyz"


# -- spans from tooltrail.local(): named after tools and models (GenAI conventions) ------------


@tool
def lookup(key: str) -> str:
    """Look a key up; 'missing' is a soft error."""
    if key == "missing":
        raise ToolError(f"no entry {key!r}")
    return f"{key}=1"


@tool
def forbidden() -> str:
    """A tool the host's hook refuses."""
    raise AssertionError("the hook blocks it; the body never runs")


class RefuseForbidden:
    async def pre_tool(self, ctx: PreToolUseContext) -> Block | None:
        return Block("not today") if ctx.tool_name == "forbidden" else None


async def test_local_names_spans_after_tools_and_models(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The caller's OTEL_* reach tooltrail's providers, never the embedded server.
    monkeypatch.setenv("TOOLTRAIL_OTEL_ENABLED", "true")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)  # the host's provider: local() keeps it
    model = ScriptedModel(
        [
            tool_call_response(
                ("m1", "lookup", {"key": "a"}), usage=Usage(input_tokens=11, output_tokens=7)
            ),
            text_response("a is 1", usage=Usage(input_tokens=20, output_tokens=3)),
        ]
    )
    host = Host([lookup, forbidden], hooks=[RefuseForbidden()], model=model)
    session = f"otel-{uuid.uuid4()}"
    try:
        async with tooltrail.local(host, database_url=f"sqlite:///{tmp_path / 'a.db'}") as tt:
            turn = await tt.run_turn(
                [
                    ToolCall("c1", "lookup", {"key": "k"}),
                    ToolCall("c2", "lookup", {"key": "missing"}),
                    ToolCall("c3", "forbidden", {}),
                ],
                session_id=session,
            )
            run = await tt.run_agent("what is a?", session_id=session, model="scripted-1")
    finally:
        use_tracer_provider(None)
    assert [r.is_error for r in turn.results] == [False, True, True]
    assert run.text == "a is 1"
    spans = list(exporter.get_finished_spans())

    tools = {
        s.attributes["gen_ai.tool.call.id"]: s
        for s in spans
        if s.attributes is not None and s.name.startswith("execute_tool ")
    }
    assert sorted((call, s.name) for call, s in tools.items()) == [
        ("c1", "execute_tool lookup"),
        ("c2", "execute_tool lookup"),
        ("c3", "execute_tool forbidden"),
        ("m1", "execute_tool lookup"),
    ]
    ok, soft, refused = tools["c1"], tools["c2"], tools["c3"]
    assert ok.attributes is not None and dict(ok.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": session,
        "tooltrail.turn.id": turn.turn_id,
        "tooltrail.attempt": 0,
    }
    assert ok.kind == SpanKind.INTERNAL and ok.status.status_code == StatusCode.UNSET
    assert soft.status.status_code == StatusCode.ERROR
    assert soft.attributes is not None and soft.attributes["error.type"] == "tool_error"
    assert refused.status.status_code == StatusCode.ERROR
    assert refused.attributes is not None
    assert refused.attributes["tooltrail.refused_by"] == "hook"
    # Arguments and outputs are never span attributes.
    assert not any("missing" in str(v) for s in spans for v in (s.attributes or {}).values())

    chats = [s for s in spans if s.name.startswith("chat")]
    assert [s.name for s in chats] == ["chat scripted-1", "chat scripted-1"]
    usage = [
        (s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"])
        for s in chats
        if s.attributes is not None
    ]
    assert usage == [(11, 7), (20, 3)]
    first = chats[0]
    assert first.kind == SpanKind.CLIENT and first.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == "scripted-1"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    # Temporal's interceptor was on too (TOOLTRAIL_OTEL_ENABLED): the tool's span is its
    # activity's child, one trace per turn.
    by_id = {s.context.span_id: s for s in spans}
    assert ancestors(ok, by_id)[:2] == [
        f"RunActivity:{TOOL_EXECUTE}",
        f"StartActivity:{TOOL_EXECUTE}",
    ]


def test_ensure_configured_keeps_the_applications_provider(otel_env: pytest.MonkeyPatch) -> None:
    assert ensure_configured(Settings(otel_enabled=False)) is None
    use_tracer_provider(TracerProvider())
    try:
        assert ensure_configured() is None  # nothing of ours replaces the host's provider
    finally:
        use_tracer_provider(None)
