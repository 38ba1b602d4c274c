"""OpenTelemetry tracing, set up once per process from the standard OTEL_* variables.

With no ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) nothing is
installed and the API's no-op tracer makes every span free. With one, spans go
through a ``BatchSpanProcessor`` with a bounded queue to an OTLP exporter
(``http/protobuf`` by default, ``grpc`` if ``OTEL_EXPORTER_OTLP_PROTOCOL`` says so):
a collector that is down or slow costs dropped spans, never a slower request.
Context crosses the Ray actor call as a W3C ``traceparent`` carried in the payload.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_provider: object | None = None
TRACE_ENV_PREFIXES = ("OTEL_",)


def tracing_endpoint() -> str | None:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)


def tracing_env() -> dict[str, str]:
    """The OTEL_* variables to hand to Ray workers (their processes may not inherit them)."""
    return {k: v for k, v in os.environ.items() if k.startswith(TRACE_ENV_PREFIXES)}


def setup_tracing(service_name: str) -> bool:
    """Installs the SDK provider if an endpoint is configured. Idempotent; True if on."""
    global _provider
    with _LOCK:
        if _provider is not None:
            return True
        if not tracing_endpoint() or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return False
        try:
            _provider = _make_provider(service_name)
        except Exception:  # tracing must never take the service down
            log.exception("tracing setup failed; continuing without traces")
            return False
        trace.set_tracer_provider(_provider)  # type: ignore[arg-type]
        return True


def _make_provider(service_name: str) -> object:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(timeout=2), max_queue_size=4096, schedule_delay_millis=500,
        export_timeout_millis=2000,
    ))
    return provider


def shutdown_tracing() -> None:
    global _provider
    with _LOCK:
        if _provider is not None:
            _provider.shutdown()  # type: ignore[attr-defined]
            _provider = None


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject() -> dict[str, str]:
    """The current context as W3C headers, to carry across a Ray call."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(carrier or {}))
