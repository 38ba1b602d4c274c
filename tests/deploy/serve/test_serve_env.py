import pytest

from deploy.serve import builder, serve_env


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*serve_env.REPLICA_ENV, *serve_env.PROXY_ENV):
        monkeypatch.delenv(name, raising=False)


def test_fast_path_by_default() -> None:
    env = serve_env.cluster_env()
    assert env["RAY_SERVE_PROXY_USE_GRPC"] == "1"
    assert env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert env["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"
    assert "RAY_SERVE_PROXY_USE_GRPC" not in serve_env.replica_env()  # a proxy's, not a replica's


def test_an_operator_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "1")
    assert serve_env.cluster_env()["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "1"
    assert serve_env.replica_env()["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "1"


def test_every_replica_gets_the_replica_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    env = builder._actor_options(1.0)["runtime_env"]["env_vars"]
    assert env["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
