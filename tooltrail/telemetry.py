"""OpenTelemetry for tooltrail: turn → attempt traces and tool-call metrics.

Traces come from Temporal's ``TracingInterceptor`` (``temporalio.contrib.opentelemetry``)
rather than spans of our own in workflow code: it carries the trace context in Temporal
headers across the client, the workflow and every worker. One turn is one trace::

    StartWorkflow:TurnWorkflow                    the client's span: the turn, real duration
    ├── RunWorkflow:TurnWorkflow                  marker, zero length
    ├── StartActivity:tooltrail.tool.execute      marker, one per attempt, zero length
    │   └── RunActivity:tooltrail.tool.execute    the attempt on its worker, real duration
    └── ...                                       (reflector, audit activities alike)

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
module only picks the exporters named by ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``.
The OTLP exporters are an optional package (``opentelemetry-exporter-otlp``); without it an
``otlp`` choice logs a warning and exports nothing, rather than failing the worker.

Nothing here may be called from workflow code.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from opentelemetry import metrics, trace

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
from opentelemetry.trace import TracerProvider
from opentelemetry.util.types import AnyValue
from temporalio.contrib.opentelemetry import TracingInterceptor

from tooltrail.settings import Settings

__all__ = [
    "BREAKER_STATE_VALUES",
    "METER_NAME",
    "Telemetry",
    "ToolMetrics",
    "configure_from_env",
    "record_breaker_state",
    "record_call",
    "record_retry",
    "tracing_interceptors",
    "use_meter_provider",
]

log = logging.getLogger("tooltrail.telemetry")

METER_NAME = "tooltrail"
"""Instrumentation scope of tooltrail's tracer and meter."""

BreakerState = Literal["closed", "half_open", "open"]

BREAKER_STATE_VALUES: Mapping[str, int] = {"closed": 0, "half_open": 1, "open": 2}
"""What ``tooltrail.breaker.state`` reports for each breaker state (higher is worse)."""


# -- traces ----------------------------------------------------------------------------------


def tracing_interceptors(tracer_provider: TracerProvider | None = None) -> list[TracingInterceptor]:
    """Return the interceptors that trace turns and tool attempts.

    Pass them to the *client* (``connect_client(address, interceptors=...)``); a worker built
    on that client uses them too, so do not also pass them to ``build_worker``.

    Args:
        tracer_provider: where spans go (default: the global provider, looked up when each
            span starts, so a provider installed later is still used).
    """
    tracer = None if tracer_provider is None else tracer_provider.get_tracer(METER_NAME)
    return [TracingInterceptor(tracer)]


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
            found.append((name, ConsoleSpanExporter()))
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
            exporter = ConsoleMetricExporter()
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
