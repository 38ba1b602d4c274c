"""The builder copied every OTEL_* variable into each replica's
runtime_env (stored in GCS, visible on the dashboard), OTEL_EXPORTER_OTLP_HEADERS (often a
collector token) included. Only an allow-list of non-secret settings is copied now."""

from __future__ import annotations

import pytest

from deploy.tracing import tracing_env


def test_only_non_secret_otel_settings_reach_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-token=s3cret")
    monkeypatch.setenv("OTEL_SOMETHING_NEW", "unknown")
    env = tracing_env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert not {"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "OTEL_SOMETHING_NEW"} & set(env)
    assert "s3cret" not in repr(env)


@pytest.mark.parametrize(("sampler", "arg", "decision"), [
    ("parentbased_traceidratio", "0.0", "DROP"),  # a client's sampled flag forces nothing
    ("parentbased_always_off", None, "DROP"),
    ("parentbased_always_on", None, "RECORD_AND_SAMPLE"),
])
def test_a_remote_sampled_flag_does_not_force_sampling(
        monkeypatch: pytest.MonkeyPatch, sampler: str, arg: str | None, decision: str) -> None:
    """With ``parentbased_*`` samplers (the manifests'), the incoming
    ``traceparent``'s sampled flag decided; now the root sampler does."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from deploy.tracing import sampler_from_env

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    parent = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
    ctx = trace.set_span_in_context(NonRecordingSpan(parent))
    assert sampler_from_env().should_sample(ctx, 0x1234, "POST /v1/messages").decision.name \
        == decision
