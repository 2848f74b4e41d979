"""OpenTelemetry for tooltrail: turn → attempt traces and tool-call metrics.

Traces come from Temporal's ``TracingInterceptor`` (``temporalio.contrib.opentelemetry``)
rather than spans of our own in workflow code: it carries the trace context in Temporal
headers across the client, the workflow and every worker. One turn is one trace::

    StartWorkflow:TurnWorkflow                    the client's span: the turn, real duration
    ├── RunWorkflow:TurnWorkflow                  marker, zero length
    ├── StartActivity:tooltrail.tool.execute      marker, one per attempt, zero length
    │   └── RunActivity:tooltrail.tool.execute    the attempt on its worker, real duration
    │       └── execute_tool lookup               the tool's own span (GenAI conventions)
    └── ...                                       (reflector, audit activities alike)

Temporal's spans are named after the activity *type*, which is the same for every tool, so
the attempt also opens a span of its own named after the tool, following the OpenTelemetry
GenAI semantic conventions: ``execute_tool {tool}`` with ``gen_ai.operation.name``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (and ``gen_ai.conversation.id``: the session),
status ERROR for a soft error (with ``error.type``). A model call opens ``chat {model}``
(kind CLIENT) with ``gen_ai.request.model`` and the token usage. These spans are opened in
activities, which Temporal never replays: one span per real attempt. Shadow attempts and the
hooks-only attempts of a loop stop run no tool and open none. Tool arguments and outputs are
never span attributes (they may be secrets; the audit trail has them).

The workflow-side spans are zero-length markers by the interceptor's design: it opens them
only outside replay, so a turn replayed after a worker restart or a cache eviction does not
emit them twice (the tests run with the workflow cache off to prove it). Temporal's newer
``OpenTelemetryPlugin`` gives workflow spans real durations but needs a process-global
replay-safe tracer provider, and is experimental; this module can move to it later without
changing its API. Install the interceptor on the *client*
(``connect_client(..., interceptors=tracing_interceptors())``): workers built on that client
inherit it, and giving it to the worker as well would open every worker-side span twice.

Metrics are plain OpenTelemetry instruments on a ``tooltrail`` meter; the tool activity
calls ``record_call``, ``record_retry`` and ``record_breaker_state``. Until a meter provider
is installed (``configure_from_env`` or the host's own) they are no-ops.

``configure_from_env`` is the "zero code" setup: the SDK reads the standard ``OTEL_*``
variables (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_EXPORTER_OTLP_*``, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, ...) itself; this
module only picks the exporters named by ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``
(``console`` writes to stderr, so a command's stdout stays its output).
The OTLP exporters are an optional package (``opentelemetry-exporter-otlp``); without it an
``otlp`` choice logs a warning and exports nothing, rather than failing the worker.

Nothing here may be called from workflow code.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from opentelemetry import metrics, trace
from opentelemetry.context import Context

# The synchronous gauge is still named ``_Gauge`` in the API (listed in its __all__).
from opentelemetry.metrics import Counter, Histogram, MeterProvider, _Gauge
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)
from opentelemetry.util.types import AnyValue, Attributes
from temporalio.contrib.opentelemetry import TracingInterceptor

from tooltrail.settings import Settings

if TYPE_CHECKING:
    # The return type of Tracer.start_as_current_span (a private name of the API package).
    from opentelemetry.util._decorator import _AgnosticContextManager

__all__ = [
    "BREAKER_STATE_VALUES",
    "METER_NAME",
    "ChatSpan",
    "Telemetry",
    "ToolMetrics",
    "ToolSpan",
    "chat_span",
    "configure_from_env",
    "ensure_configured",
    "provider_name",
    "record_breaker_state",
    "record_call",
    "record_retry",
    "tool_span",
    "tracer",
    "tracing_interceptors",
    "use_meter_provider",
    "use_tracer_provider",
]

log = logging.getLogger("tooltrail.telemetry")

METER_NAME = "tooltrail"
"""Instrumentation scope of tooltrail's tracer and meter."""

BreakerState = Literal["closed", "half_open", "open"]

BREAKER_STATE_VALUES: Mapping[str, int] = {"closed": 0, "half_open": 1, "open": 2}
"""What ``tooltrail.breaker.state`` reports for each breaker state (higher is worse)."""


# -- traces ----------------------------------------------------------------------------------


_tracer_provider: TracerProvider | None = None


def use_tracer_provider(tracer_provider: TracerProvider | None) -> None:
    """Send tooltrail's spans to ``tracer_provider`` (``None``: OpenTelemetry's global one).

    The global provider can be set only once per process; this is how tests and hosts with a
    provider of their own point tooltrail's spans (its own and Temporal's interceptor's, when
    built with ``tracing_interceptors()``) elsewhere. Takes effect for spans started later.
    """
    global _tracer_provider
    _tracer_provider = tracer_provider


def _current_provider() -> TracerProvider:
    return _tracer_provider or trace.get_tracer_provider()


class _TooltrailTracer(Tracer):
    """A tracer that looks its provider up at every span.

    So a provider installed (or chosen with ``use_tracer_provider``) after the interceptors
    were built still gets the spans.
    """

    def _tracer(self) -> Tracer:
        return _current_provider().get_tracer(METER_NAME)

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        return self._tracer().start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )

    def start_as_current_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _AgnosticContextManager[Span]:
        return self._tracer().start_as_current_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
            end_on_exit,
        )


_TRACER = _TooltrailTracer()


def tracer() -> Tracer:
    """Return tooltrail's tracer: spans go to ``use_tracer_provider``'s provider, or the global."""
    return _TRACER


def tracing_interceptors(tracer_provider: TracerProvider | None = None) -> list[TracingInterceptor]:
    """Return the interceptors that trace turns and tool attempts.

    Pass them to the *client* (``connect_client(address, interceptors=...)``); a worker built
    on that client uses them too, so do not also pass them to ``build_worker``.

    Args:
        tracer_provider: where spans go (default: ``use_tracer_provider``'s provider, else the
            global one, looked up when each span starts, so a provider installed later is
            still used).
    """
    chosen = _TRACER if tracer_provider is None else tracer_provider.get_tracer(METER_NAME)
    return [TracingInterceptor(chosen)]


# -- GenAI spans -----------------------------------------------------------------------------

# The OpenTelemetry GenAI semantic conventions' names (the semconv package marks its copies
# deprecated since the conventions moved to a repository of their own; the names stand).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ERROR_TYPE = "error.type"


class ToolSpan:
    """The ``execute_tool`` span of one attempt; ``finish`` records its outcome."""

    def __init__(self, span: Span, tool_name: str = "") -> None:
        """Wrap the started span of a call of ``tool_name``."""
        self.span = span
        self.tool_name = tool_name

    def finish(
        self,
        *,
        is_error: bool,
        resolved_tool_name: str = "",
        refused_by: str | None = None,
    ) -> None:
        """Record the attempt's outcome.

        Args:
            is_error: the result is a soft error (the span's status becomes ERROR).
            resolved_tool_name: the tool that actually ran, when another than the one asked.
            refused_by: what refused the call without running it (``hook``, ``breaker``).
        """
        if resolved_tool_name and resolved_tool_name != self.tool_name:
            self.span.set_attribute("tooltrail.tool.resolved_name", resolved_tool_name)
        if refused_by is not None:
            self.span.set_attribute("tooltrail.refused_by", refused_by)
        if is_error:
            # The model reads the error as a result; for the trace the call did not succeed.
            kind = f"refused_by_{refused_by}" if refused_by else "tool_error"
            self.span.set_attribute(ERROR_TYPE, kind)
            self.span.set_status(Status(StatusCode.ERROR, kind))


@contextlib.contextmanager
def tool_span(
    tool_name: str,
    *,
    tool_call_id: str,
    session_id: str | None = None,
    turn_id: str | None = None,
    attempt: int = 0,
    enabled: bool = True,
) -> Iterator[ToolSpan]:
    """Open the ``execute_tool {tool_name}`` span around one attempt (current while it runs).

    An exception leaving the block (an infrastructure failure) sets status ERROR and
    ``error.type`` (its class; never its text); a soft error is recorded by
    ``ToolSpan.finish``.

    Args:
        tool_name: the tool the model asked for.
        tool_call_id: the model's id of the call.
        session_id: the session (``gen_ai.conversation.id``).
        turn_id: the turn (``tooltrail.turn.id``).
        attempt: tooltrail's attempt number (0-based; ``tooltrail.attempt``).
        enabled: ``False`` opens nothing (an attempt that runs no tool).
    """
    if not enabled:
        yield ToolSpan(trace.INVALID_SPAN, tool_name)  # records nothing
        return
    attributes: dict[str, AnyValue] = {
        GEN_AI_OPERATION_NAME: "execute_tool",
        GEN_AI_TOOL_NAME: tool_name,
        GEN_AI_TOOL_CALL_ID: tool_call_id,
        GEN_AI_TOOL_TYPE: "function",
        "tooltrail.attempt": attempt,
    }
    if session_id:
        attributes[GEN_AI_CONVERSATION_ID] = session_id
    if turn_id:
        attributes["tooltrail.turn.id"] = turn_id
    with (
        _TRACER.start_as_current_span(
            f"execute_tool {tool_name}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span,
        _failure_recorded(span),
    ):
        yield ToolSpan(span, tool_name)


@contextlib.contextmanager
def _failure_recorded(span: Span) -> Iterator[None]:
    """Mark the span failed by an exception, by its type only.

    Not ``record_exception``: an exception's text (a database error's, say) may quote the
    data it was handling, and spans leave for a collector that is not the audit database.
    """
    try:
        yield
    except BaseException as exc:
        kind = type(exc).__qualname__
        span.set_attribute(ERROR_TYPE, kind)
        span.set_status(Status(StatusCode.ERROR, kind))
        raise


_PROVIDERS = {"OpenAIChatClient": "openai", "AnthropicMessagesClient": "anthropic"}


def provider_name(client: object) -> str | None:
    """The provider a model client talks to: ``openai``, ``anthropic``, or its ``provider_name``."""
    named = getattr(client, "provider_name", None)
    if isinstance(named, str):
        return named
    return _PROVIDERS.get(type(client).__name__)


class ChatSpan:
    """The ``chat`` span of one model call; ``finish`` records the response."""

    def __init__(self, span: Span) -> None:
        """Wrap the started span."""
        self.span = span

    def finish(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        finish_reason: str | None = None,
        response_id: str | None = None,
    ) -> None:
        """Record the response's usage, finish reason and id."""
        self.span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, input_tokens)
        self.span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens)
        if finish_reason:
            self.span.set_attribute(GEN_AI_RESPONSE_FINISH_REASONS, [finish_reason])
        if response_id:
            self.span.set_attribute(GEN_AI_RESPONSE_ID, response_id)


@contextlib.contextmanager
def chat_span(
    client: object,
    *,
    model: str | None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    session_id: str | None = None,
) -> Iterator[ChatSpan]:
    """Open the ``chat {model}`` span (kind CLIENT) around one model call.

    Args:
        client: the model client (its ``model`` is the default model; its type names the
            provider: ``openai``, ``anthropic``, or its ``provider_name`` attribute).
        model: the model asked for (``None``: the client's default).
        temperature: the request's temperature, if set.
        max_tokens: the request's token limit, if set.
        session_id: the session (``gen_ai.conversation.id``).
    """
    default = getattr(client, "model", None)
    name = model or (default if isinstance(default, str) else None)
    attributes: dict[str, AnyValue] = {GEN_AI_OPERATION_NAME: "chat"}
    optional: dict[str, AnyValue | None] = {
        GEN_AI_REQUEST_MODEL: name,
        GEN_AI_PROVIDER_NAME: provider_name(client),
        GEN_AI_REQUEST_TEMPERATURE: temperature,
        GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
        GEN_AI_CONVERSATION_ID: session_id,
    }
    attributes.update({key: value for key, value in optional.items() if value is not None})
    with (
        _TRACER.start_as_current_span(
            f"chat {name}" if name else "chat",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span,
        _failure_recorded(span),
    ):
        yield ChatSpan(span)


# -- metrics ---------------------------------------------------------------------------------


class ToolMetrics:
    """The tool-call instruments on one meter provider."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        """Create the instruments.

        Args:
            meter_provider: the provider (default: the global one; until the host installs
                one, OpenTelemetry's proxy records nothing and binds to it once installed).
        """
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter(METER_NAME)
        self.calls: Counter = meter.create_counter(
            "tooltrail.calls", unit="{call}", description="Tool call attempts that finished."
        )
        self.errors: Counter = meter.create_counter(
            "tooltrail.errors", unit="{call}", description="Tool call attempts that failed."
        )
        self.retries: Counter = meter.create_counter(
            "tooltrail.retries", unit="{retry}", description="Tool calls run again by recovery."
        )
        self.duration: Histogram = meter.create_histogram(
            "tooltrail.call.duration", unit="ms", description="Wall time of one tool attempt."
        )
        self.breaker_state: _Gauge = meter.create_gauge(
            "tooltrail.breaker.state",
            unit="1",
            description="Circuit breaker state per tool: 0 closed, 1 half-open, 2 open.",
        )

    def record_call(self, tool: str, is_error: bool, duration_ms: float) -> None:
        """Count one finished attempt of ``tool`` and record its duration."""
        attributes: dict[str, AnyValue] = {"tool": tool, "is_error": is_error}
        self.calls.add(1, attributes)
        if is_error:
            self.errors.add(1, {"tool": tool})
        self.duration.record(max(0.0, duration_ms), attributes)

    def record_retry(self, tool: str) -> None:
        """Count one recovery retry of a call of ``tool``."""
        self.retries.add(1, {"tool": tool})

    def record_breaker_state(self, tool: str, state: BreakerState | str) -> None:
        """Report ``tool``'s circuit breaker state.

        Raises:
            ValueError: ``state`` is not ``closed``, ``half_open`` or ``open``.
        """
        try:
            value = BREAKER_STATE_VALUES[state]
        except KeyError:
            raise ValueError(
                f"unknown breaker state {state!r}; expected one of {list(BREAKER_STATE_VALUES)}"
            ) from None
        self.breaker_state.set(value, {"tool": tool})


_lock = threading.Lock()
_default: ToolMetrics | None = None


def _metrics() -> ToolMetrics:
    global _default
    with _lock:
        if _default is None:
            _default = ToolMetrics()
        return _default


def use_meter_provider(meter_provider: MeterProvider | None) -> ToolMetrics:
    """Send the module-level ``record_*`` helpers to ``meter_provider`` (``None``: global).

    The global provider can be set only once per process; this is how tests and hosts with
    a provider of their own point the helpers elsewhere.
    """
    global _default
    with _lock:
        _default = ToolMetrics(meter_provider)
        return _default


def record_call(tool: str, is_error: bool, duration_ms: float) -> None:
    """Count one finished attempt of ``tool`` and record its wall time.

    Instruments: ``tooltrail.calls``, ``tooltrail.errors`` (failed attempts only) and
    ``tooltrail.call.duration`` (milliseconds).
    """
    _metrics().record_call(tool, is_error, duration_ms)


def record_retry(tool: str) -> None:
    """Count one recovery retry of a call of ``tool`` (``tooltrail.retries``)."""
    _metrics().record_retry(tool)


def record_breaker_state(tool: str, state: BreakerState | str) -> None:
    """Report ``tool``'s circuit breaker state (``tooltrail.breaker.state``).

    Raises:
        ValueError: ``state`` is not ``closed``, ``half_open`` or ``open``.
    """
    _metrics().record_breaker_state(tool, state)


# -- SDK setup from the environment ----------------------------------------------------------


@dataclass(frozen=True)
class Telemetry:
    """What ``configure_from_env`` installed."""

    tracer_provider: SdkTracerProvider
    """The SDK tracer provider (its exporters per ``OTEL_TRACES_EXPORTER``)."""
    meter_provider: SdkMeterProvider
    """The SDK meter provider (its exporters per ``OTEL_METRICS_EXPORTER``)."""
    trace_exporters: tuple[str, ...]
    """The trace exporters actually in use (``otlp``, ``console``)."""
    metric_exporters: tuple[str, ...]
    """The metric exporters actually in use."""

    def flush(self) -> None:
        """Export what is buffered now (the providers keep running)."""
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()

    def shutdown(self) -> None:
        """Flush and stop both providers (call on worker exit, or spans are lost)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


_OTLP_MODULES = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http",
}


def _exporter_names(variable: str) -> list[str]:
    # The spec's default for both signals is "otlp"; "none" switches a signal off.
    raw = os.environ.get(variable, "otlp")
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    return [] if "none" in names else names


def _otlp_protocol(signal: Literal["TRACES", "METRICS"]) -> str | None:
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or None
    )


def _load_otlp(signal: Literal["TRACES", "METRICS"]) -> object | None:
    """Return an OTLP exporter instance for ``signal``, or ``None`` if none is installed.

    The exporter reads its endpoint, headers, timeout and certificates from the
    ``OTEL_EXPORTER_OTLP_*`` variables itself.
    """
    requested = _otlp_protocol(signal)
    # Without an explicit protocol, the spec's default (http/protobuf), then gRPC.
    candidates = [requested] if requested else ["http/protobuf", "grpc"]
    submodule, cls = (
        ("trace_exporter", "OTLPSpanExporter")
        if signal == "TRACES"
        else ("metric_exporter", "OTLPMetricExporter")
    )
    for protocol in candidates:
        package = _OTLP_MODULES.get(protocol)
        if package is None:
            log.warning("OTLP protocol %r is not supported here; exporting no %s", protocol, signal)
            return None
        try:
            module = importlib.import_module(f"{package}.{submodule}")
        except ImportError:
            continue
        exporter: object = getattr(module, cls)()
        return exporter
    log.warning(
        "OTEL_%s_EXPORTER asks for otlp but no OTLP exporter is installed "
        "(pip install opentelemetry-exporter-otlp); exporting no %s",
        signal,
        signal.lower(),
    )
    return None


def _span_exporters() -> list[tuple[str, SpanExporter]]:
    found: list[tuple[str, SpanExporter]] = []
    for name in _exporter_names("OTEL_TRACES_EXPORTER"):
        if name == "console":
            # stderr: a command's stdout is its output (``--json`` must stay pure JSON).
            found.append((name, ConsoleSpanExporter(out=sys.stderr)))
        elif name == "otlp":
            exporter = _load_otlp("TRACES")
            if isinstance(exporter, SpanExporter):
                found.append((name, exporter))
        else:
            log.warning("OTEL_TRACES_EXPORTER %r is not supported; ignored", name)
    return found


def _metric_readers() -> list[tuple[str, MetricReader]]:
    found: list[tuple[str, MetricReader]] = []
    for name in _exporter_names("OTEL_METRICS_EXPORTER"):
        exporter: object | None = None
        if name == "console":
            exporter = ConsoleMetricExporter(out=sys.stderr)
        elif name == "otlp":
            exporter = _load_otlp("METRICS")
        else:
            log.warning("OTEL_METRICS_EXPORTER %r is not supported; ignored", name)
        if isinstance(exporter, MetricExporter):
            # The reader reads OTEL_METRIC_EXPORT_INTERVAL / _TIMEOUT itself.
            found.append((name, PeriodicExportingMetricReader(exporter)))
    return found


_configured: Telemetry | None = None


def configure_from_env(
    settings: Settings | None = None, *, set_global: bool = True
) -> Telemetry | None:
    """Set up the OpenTelemetry SDK from the standard ``OTEL_*`` variables.

    Does nothing (returns ``None``) unless ``TOOLTRAIL_OTEL_ENABLED`` is true, or when
    ``OTEL_SDK_DISABLED`` is true. The service name defaults to ``tooltrail`` when neither
    ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one. Idempotent: later calls
    return the first result (the global providers can be set only once).

    Args:
        settings: tooltrail's settings (default: loaded from the environment).
        set_global: install the providers as OpenTelemetry's globals, and point the
            ``record_*`` helpers at the meter provider. ``False`` only builds them.

    Returns:
        The providers (call ``shutdown()`` on exit), or ``None`` when telemetry is off.
    """
    global _configured
    settings = settings or Settings()
    if not settings.otel_enabled:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("OTEL_SDK_DISABLED is true; telemetry stays off")
        return None
    if set_global and _configured is not None:
        return _configured
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "tooltrail"}))
    tracer_provider = SdkTracerProvider(resource=resource)
    span_exporters = _span_exporters()
    for _, exporter in span_exporters:
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    readers = _metric_readers()
    meter_provider = SdkMeterProvider(
        resource=resource, metric_readers=[reader for _, reader in readers]
    )
    result = Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        trace_exporters=tuple(name for name, _ in span_exporters),
        metric_exporters=tuple(name for name, _ in readers),
    )
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        use_meter_provider(meter_provider)
        _configured = result
    log.info(
        "OpenTelemetry on: traces to %s, metrics to %s",
        ", ".join(result.trace_exporters) or "nowhere",
        ", ".join(result.metric_exporters) or "nowhere",
    )
    return result


def _application_has_provider() -> bool:
    """Whether spans already have somewhere to go that is not ours to replace."""
    if _tracer_provider is not None:
        return True
    installed = trace.get_tracer_provider()
    return not isinstance(installed, ProxyTracerProvider | NoOpTracerProvider)


def ensure_configured(settings: Settings | None = None) -> Telemetry | None:
    """Set up OpenTelemetry from ``OTEL_*`` where a worker runs, unless someone else did.

    What ``tooltrail worker``, ``dev``, ``demo``, ``run`` and ``tooltrail.local()`` call. With
    ``TOOLTRAIL_OTEL_ENABLED`` true it installs the providers of ``configure_from_env``,
    except when the application installed a tracer provider of its own (globally, or with
    ``use_tracer_provider``): tooltrail's spans then go there and nothing is replaced.

    Returns:
        What ``configure_from_env`` installed (now or earlier), or ``None``.
    """
    settings = settings or Settings()
    if not settings.otel_enabled:
        return None
    if _configured is None and _application_has_provider():
        log.info("OpenTelemetry: the application's tracer provider is in place; kept")
        return None
    return configure_from_env(settings)
