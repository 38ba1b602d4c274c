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
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_provider: object | None = None
# The OTEL_* variables copied into every replica's runtime_env (stored in GCS, shown on the
# dashboard): an allow-list of non-secret settings. OTEL_EXPORTER_OTLP_HEADERS (and the
# traces variant), which usually carry a collector token, are never copied: set them in
# each node's or pod's own environment, which Ray's workers inherit.
_BSP = ("SCHEDULE_DELAY", "EXPORT_TIMEOUT", "MAX_QUEUE_SIZE", "MAX_EXPORT_BATCH_SIZE")
_OTLP = ("ENDPOINT", "PROTOCOL", "TIMEOUT", "COMPRESSION", "CERTIFICATE", "INSECURE")
TRACE_ENV_ALLOWED = frozenset({
    "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PROPAGATORS",
    "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
    *(f"OTEL_BSP_{n}" for n in _BSP),
    *(f"OTEL_EXPORTER_OTLP_{n}" for n in _OTLP),
    *(f"OTEL_EXPORTER_OTLP_TRACES_{n}" for n in _OTLP),
})


def tracing_endpoint() -> str | None:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)


def tracing_env() -> dict[str, str]:
    """The allowed OTEL_* variables to hand to Ray workers (their processes may not inherit
    them); secrets such as OTEL_EXPORTER_OTLP_HEADERS stay out (``TRACE_ENV_ALLOWED``)."""
    return {k: v for k, v in os.environ.items() if k in TRACE_ENV_ALLOWED}


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
    provider = TracerProvider(resource=Resource.create({"service.name": name}),
                              sampler=sampler_from_env())
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(timeout=2), max_queue_size=4096, schedule_delay_millis=500,
        export_timeout_millis=2000,
    ))
    return provider


def sampler_from_env() -> Any:
    """``OTEL_TRACES_SAMPLER``, except that a parent-based sampler never lets a *remote*
    parent's sampled flag decide: a client could otherwise force every request it sends
    into the traces. The root sampler decides for remote parents too;
    ratio sampling is a pure function of the trace id, so router and workers still agree."""
    from opentelemetry.sdk.trace import sampling

    base = sampling._get_from_env_or_default()  # noqa: SLF001 - the SDK's own env parsing
    if not isinstance(base, sampling.ParentBased):
        return base
    root = base._root  # noqa: SLF001
    return sampling.ParentBased(root, remote_parent_sampled=root,
                                remote_parent_not_sampled=root)


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
