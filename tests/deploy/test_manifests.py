"""Deployment artifacts are checked offline: Serve configs, KubeRay manifests, the Ray
cluster launcher config and the Dockerfiles.

* Every YAML parses.
* ``deploy/local.yaml``, ``deploy/cluster.yaml`` and the ``serveConfigV2`` embedded in
  ``deploy/kuberay/rayservice.yaml`` validate through Ray Serve's own schema
  (``ServeDeploySchema``) and through ``deploy.config.load_config``; the app builder builds
  them, and every Serve ``deployments:`` override names a deployment the builder makes.
* The RayService is checked against a hand-written expectation of the KubeRay ``ray.io/v1``
  fields and the operator's own validation rules (``ValidateRayClusterSpec`` in KubeRay 1.7:
  no ``rayStartParams['labels']``, resources not set twice, token auth needs Ray >= 2.52).
  No package installed here ships the KubeRay CRD; ``ops/dev/check_rayservice_crd.py CRD``
  runs the full OpenAPI check (unknown fields rejected, like ``kubectl apply
  --validate=strict``) where the CRD file is at hand.
* The cluster launcher config validates against Ray's ``ray-schema.json`` and Ray's own
  ``prepare_config`` / ``validate_config``.
* Dockerfiles cannot be built here: they are parsed line by line for basic sanity.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deploy.config import APP_IMPORT_PATH, KvrouteConfig, load_config
from deploy.serve.builder import ROUTER_DEPLOYMENT, app_builder

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERAY = DEPLOY / "kuberay"
DOCKER = DEPLOY / "docker"
ALL_YAML = sorted([*DEPLOY.glob("*.yaml"), *KUBERAY.glob("*.yaml")])
SERVE_CONFIGS = [DEPLOY / "local.yaml", DEPLOY / "cluster.yaml"]
DOCKERFILES = {"Dockerfile.cuda": "vllm", "Dockerfile.cpu": "mlx"}
MIN_RAY_FOR_TOKEN_AUTH = (2, 52)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _one(path: Path, kind: str) -> dict[str, Any]:
    found = [d for d in _docs(path) if d.get("kind") == kind]
    assert len(found) == 1, f"{path.name}: expected one {kind}, found {len(found)}"
    return found[0]


def _rayservice() -> dict[str, Any]:
    return _one(KUBERAY / "rayservice.yaml", "RayService")


def _serve_config(name: str) -> dict[str, Any]:
    if name == "rayservice.yaml":
        data = yaml.safe_load(_rayservice()["spec"]["serveConfigV2"])
    else:
        data = yaml.safe_load((DEPLOY / name).read_text())
    assert isinstance(data, dict)
    return data


def _kvroute_app(serve_config: dict[str, Any]) -> dict[str, Any]:
    apps = [a for a in serve_config["applications"] if a.get("import_path") == APP_IMPORT_PATH]
    assert len(apps) == 1
    return apps[0]


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _worker_groups() -> dict[str, dict[str, Any]]:
    groups = _rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {g["groupName"]: g for g in groups}


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return list(group["template"]["spec"]["containers"])


# --- every YAML -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    docs = _docs(path)
    assert docs and all(isinstance(d, dict) for d in docs)


def test_all_expected_artifacts_exist() -> None:
    expected = [
        "deploy/local.yaml", "deploy/cluster.yaml", "deploy/ray-cluster.yaml",
        "deploy/kuberay/rayservice.yaml", "deploy/kuberay/redis.yaml",
        "deploy/kuberay/otel-collector.yaml", "deploy/docker/Dockerfile.cuda",
        "deploy/docker/Dockerfile.cpu", "docs/deploy.md", "docs/scale-out.md",
    ]
    assert [p for p in expected if not (ROOT / p).is_file()] == []


# --- Serve configs ----------------------------------------------------------------------

SERVE_CONFIG_NAMES = ["local.yaml", "cluster.yaml", "rayservice.yaml"]


@pytest.mark.parametrize("name", SERVE_CONFIG_NAMES)
def test_serve_config_validates_with_ray_serve_schema(name: str) -> None:
    schema = ServeDeploySchema.model_validate(_serve_config(name))
    assert [a.import_path for a in schema.applications] == [APP_IMPORT_PATH]


@pytest.mark.parametrize("name", SERVE_CONFIG_NAMES)
def test_serve_config_validates_with_load_config(name: str, tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(_serve_config(name)))
    cfg = load_config(path)
    assert isinstance(cfg, KvrouteConfig) and cfg.models


@pytest.mark.parametrize("name", SERVE_CONFIG_NAMES)
def test_builder_builds_and_overrides_name_real_deployments(
    name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.serve._private.build_app import build_app

    monkeypatch.setenv("KVROUTE_API_KEYS", f"ops:{'ab' * 32}")  # the Secret / node env
    app = _kvroute_app(_serve_config(name))
    built = build_app(app_builder(app["args"]), name=app["name"])
    names = {d.name for d in built.deployments}
    assert ROUTER_DEPLOYMENT in names
    assert {m["name"] for m in app["args"]["models"]} <= names
    overrides = {d["name"] for d in app.get("deployments", [])}
    assert overrides <= names, f"overrides of unknown deployments: {overrides - names}"


@pytest.mark.parametrize("name", ["cluster.yaml", "rayservice.yaml"])
def test_cluster_configs_two_autoscaled_models_and_redis(name: str) -> None:
    sc = _serve_config(name)
    app = _kvroute_app(sc)
    cfg = KvrouteConfig.model_validate(app["args"])
    assert [m.name for m in cfg.models] == ["big", "small"]
    assert cfg.index.redis_url and cfg.index.redis_url.startswith(("redis://", "rediss://"))
    for m in cfg.models:
        assert m.autoscaling is not None, f"{m.name}: no autoscaling"
        # Serve never scales a deployment whose cap is below its target.
        assert m.autoscaling.target_ongoing_requests < m.max_ongoing_requests
        assert m.context_window == m.engine_kwargs.get("max_model_len", m.context_window)
    router = {d["name"]: d for d in app.get("deployments", [])}[ROUTER_DEPLOYMENT]
    auto = router["autoscaling_config"]
    assert 1 <= auto["min_replicas"] <= auto["max_replicas"]
    assert auto["target_ongoing_requests"] < 1024  # the router's max_ongoing_requests
    assert sc["http_options"]["host"] == "0.0.0.0"
    assert sc["http_options"]["port"] == cfg.server.port


@pytest.mark.parametrize("name", ["cluster.yaml", "rayservice.yaml"])
def test_cluster_configs_require_api_keys(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference configs bind 0.0.0.0, so they must not deploy open;
    keys come from KVROUTE_API_KEYS where the app is built, and server.host is the bind."""
    sc = _serve_config(name)
    cfg = KvrouteConfig.model_validate(_kvroute_app(sc)["args"])
    assert cfg.auth.required and cfg.auth.api_keys_env == "KVROUTE_API_KEYS"
    assert cfg.server.host == sc["http_options"]["host"]
    monkeypatch.delenv("KVROUTE_API_KEYS", raising=False)
    with pytest.raises(ValueError, match="auth.required"):
        app_builder(_kvroute_app(sc)["args"])


def test_rayservice_pods_get_api_keys_from_a_secret() -> None:
    """Serve may build the app on any pod: every Ray container has KVROUTE_API_KEYS from
    the kvroute-api-keys Secret, never a literal value."""
    spec = _rayservice()["spec"]["rayClusterConfig"]
    groups = [spec["headGroupSpec"], *_worker_groups().values()]
    for container in (c for g in groups for c in _containers(g)):
        env = {e["name"]: e for e in container.get("env", [])}
        keys = env.get("KVROUTE_API_KEYS")
        assert keys is not None and "value" not in keys, container["name"]
        ref = keys["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "kvroute-api-keys" and ref["key"] and not ref.get("optional")


def test_cluster_yaml_otel_env_and_pending_groups_block() -> None:
    app = _kvroute_app(_serve_config("cluster.yaml"))
    env = app["runtime_env"]["env_vars"]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in env
    assert all(k.startswith("OTEL_") and isinstance(v, str) for k, v in env.items())
    # The `coder -> [big, small]` alias: live once groups exist, until then a marked comment.
    text = (DEPLOY / "cluster.yaml").read_text()
    assert "groups" in app["args"] or re.search(r"#\s*coder: \[big, small\]", text)


def test_local_yaml_stays_offline_demo() -> None:
    cfg = load_config(DEPLOY / "local.yaml")
    assert cfg.index.redis_url is None
    assert _serve_config("local.yaml")["http_options"]["host"] == "127.0.0.1"


# --- RayService -----------------------------------------------------------------------


def _check_group(name: str, group: dict[str, Any], head: bool) -> None:
    params = group.get("rayStartParams", {})
    assert isinstance(params, dict) and all(isinstance(v, str) for v in params.values()), (
        f"{name}: rayStartParams values must be strings"
    )
    # KubeRay 1.7 ValidateRayClusterSpec.
    assert "labels" not in params, f"{name}: use the group's `labels`, not rayStartParams"
    set_twice = {"num-cpus", "num-gpus", "memory", "resources"} & set(params)
    assert not (set_twice and group.get("resources")), f"{name}: resources set twice"
    containers = _containers(group)
    assert containers and all(c.get("name") and c.get("image") for c in containers)
    for key, value in group.get("labels", {}).items():
        assert re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", key)
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", value)
    if head:
        return
    assert isinstance(group["groupName"], str) and group["groupName"]
    assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    ports = {p["containerPort"] for c in containers for p in c.get("ports", [])}
    assert 8000 in ports, f"{name}: Serve's proxy port (readiness probe) not declared"


def test_rayservice_structure() -> None:
    """Hand-written expectation of the RayService v1 fields (no CRD schema offline)."""
    rs = _rayservice()
    assert rs["apiVersion"] == "ray.io/v1" and rs["kind"] == "RayService"
    assert rs["metadata"]["name"]
    spec = rs["spec"]
    assert set(spec) <= {"serveConfigV2", "rayClusterConfig", "upgradeStrategy",
                         "serveService", "excludeHeadPodFromServeSvc",
                         "rayClusterDeletionDelaySeconds", "suspend", "managedBy"}
    assert isinstance(spec["serveConfigV2"], str)
    rc = spec["rayClusterConfig"]
    assert set(rc) <= {"rayVersion", "authOptions", "enableInTreeAutoscaling",
                       "autoscalerOptions", "headGroupSpec", "workerGroupSpecs",
                       "headServiceAnnotations", "gcsFaultToleranceOptions", "suspend",
                       "upgradeStrategy", "managedBy", "networkPolicy", "tlsOptions"}
    _check_group("head", rc["headGroupSpec"], head=True)
    for name, group in _worker_groups().items():
        _check_group(name, group, head=False)
    auth = rc.get("authOptions")
    if auth is not None and auth.get("mode", "token") == "token":
        assert _version(rc["rayVersion"]) >= MIN_RAY_FOR_TOKEN_AUTH
    if rc.get("enableInTreeAutoscaling"):
        assert rc.get("autoscalerOptions", {}).get("version", "v2") in ("v1", "v2")


def test_rayservice_groups_fit_the_serve_config() -> None:
    """Worker groups can hold every replica the Serve config may ask for, where it asks."""
    app = _kvroute_app(_serve_config("rayservice.yaml"))
    cfg = KvrouteConfig.model_validate(app["args"])
    groups = _worker_groups()
    gpu = groups["gpu-vllm"]
    gpus_per_pod = int(_containers(gpu)[0]["resources"]["limits"]["nvidia.com/gpu"])
    gpus_needed = sum(m.autoscaling.max_replicas * m.num_gpus
                      for m in cfg.models if m.autoscaling)
    assert gpu["maxReplicas"] * gpus_per_pod >= gpus_needed
    router = {d["name"]: d for d in app["deployments"]}[ROUTER_DEPLOYMENT]
    selector = router["ray_actor_options"]["label_selector"]
    homes = [g for g in groups.values() if selector.items() <= g.get("labels", {}).items()]
    assert len(homes) == 1, "the router's label_selector must match exactly one group"
    assert cfg.router.max_replicas_per_node == 1
    assert homes[0]["maxReplicas"] >= router["autoscaling_config"]["max_replicas"]
    cpus = float(_containers(homes[0])[0]["resources"]["limits"]["cpu"])
    assert cpus >= router["ray_actor_options"]["num_cpus"]


def test_rayservice_images_and_versions_agree_with_dockerfiles() -> None:
    rc = _rayservice()["spec"]["rayClusterConfig"]
    groups = [rc["headGroupSpec"], *rc["workerGroupSpecs"]]
    images = [c["image"] for g in groups for c in _containers(g)]
    for image in images:
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
    for name in DOCKERFILES:
        args = _dockerfile_args(_instructions(DOCKER / name))
        assert args["RAY_VERSION"] == rc["rayVersion"], name


def _redis(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Deployment and Service of one Redis in redis.yaml."""
    found = {(d["kind"], d["metadata"]["name"]): d for d in _docs(KUBERAY / "redis.yaml")}
    return found[("Deployment", name)], found[("Service", name)]


def _redis_url_of(name: str) -> str:
    svc = _redis(name)[1]
    return f"redis://{name}:{svc['spec']['ports'][0]['port']}/"


def _server_args(deployment: dict[str, Any]) -> dict[str, str]:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return dict(zip(args[::2], args[1::2], strict=True))


def test_rate_limits_have_their_own_redis_that_never_evicts() -> None:
    """The limiter's state is not in the index's evicting Redis."""
    app = _kvroute_app(_serve_config("rayservice.yaml"))
    store = KvrouteConfig.model_validate(app["args"]).auth.rate_limit_store
    assert store.redis_url and store.redis_url.startswith(_redis_url_of("kvroute-redis-limits"))
    assert _server_args(_redis("kvroute-redis-limits")[0])["--maxmemory-policy"] == "noeviction"
    assert _server_args(_redis("kvroute-redis")[0])["--maxmemory-policy"] == "volatile-lru"
    policy = _one(KUBERAY / "redis.yaml", "NetworkPolicy")
    guarded = policy["spec"]["podSelector"]["matchExpressions"][0]["values"]
    assert set(guarded) == {"kvroute-redis", "kvroute-redis-limits"}
    cluster = KvrouteConfig.model_validate(_kvroute_app(_serve_config("cluster.yaml"))["args"])
    url = cluster.auth.rate_limit_store.redis_url
    assert url and url != cluster.index.redis_url


def test_index_and_collector_services_match_the_rayservice() -> None:
    otel_svc = _one(KUBERAY / "otel-collector.yaml", "Service")
    app = _kvroute_app(_serve_config("rayservice.yaml"))
    assert app["args"]["index"]["redis_url"].startswith(_redis_url_of("kvroute-redis"))
    otel_ports = {p["port"] for p in otel_svc["spec"]["ports"]}
    rc = _rayservice()["spec"]["rayClusterConfig"]
    for group in [rc["headGroupSpec"], *rc["workerGroupSpecs"]]:
        env = {e["name"]: e.get("value") for e in _containers(group)[0].get("env", [])}
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        host, port = endpoint.removeprefix("http://").split(":")
        assert host == otel_svc["metadata"]["name"] and int(port) in otel_ports
        # the NetworkPolicy in redis.yaml admits these pods
        labels = group["template"]["metadata"]["labels"]
        policy = _one(KUBERAY / "redis.yaml", "NetworkPolicy")
        allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
        assert allowed.items() <= labels.items()


def test_collector_config_is_a_consistent_pipeline() -> None:
    cm = _one(KUBERAY / "otel-collector.yaml", "ConfigMap")
    conf = yaml.safe_load(cm["data"]["config.yaml"])
    protocols = conf["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    traces = conf["service"]["pipelines"]["traces"]
    for section in ("receivers", "processors", "exporters"):
        assert set(traces[section]) <= set(conf[section]), section
    assert traces["processors"][0] == "memory_limiter"


# --- Ray cluster launcher ---------------------------------------------------------------


def test_ray_cluster_launcher_config_validates() -> None:
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(cfg, json.loads(schema_path.read_text()))
    validate_config(prepare_config(copy.deepcopy(cfg)))
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    starts = " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"])
    assert starts.count("RAY_AUTH_MODE=token") == 2
    assert any(t.get("resources", {}).get("GPU") for t in types.values())
    assert cfg["max_workers"] >= sum(t.get("max_workers", 0) for t in types.values())


# --- Dockerfiles ----------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name}: dangling line continuation"
    return out


def _dockerfile_args(instructions: list[tuple[str, str]]) -> dict[str, str]:
    args: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = _expand(value, args)
    return args


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def _copy_sources(instructions: list[tuple[str, str]]) -> Iterator[str]:
    for word, rest in instructions:
        if word == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            yield from parts[:-1]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_sanity(name: str) -> None:
    path = DOCKER / name
    ins = _instructions(path)
    words = [w for w, _ in ins]
    assert "FROM" in words, "no FROM"
    assert set(words) <= {"ARG", "FROM", "RUN", "COPY", "ENV", "WORKDIR", "USER",
                          "EXPOSE", "LABEL", "ENTRYPOINT", "CMD"}, words
    args = _dockerfile_args(ins)
    for word, rest in ins:
        if word == "FROM":
            image = _expand(rest.split()[0], args)
            assert "$" not in image, f"unresolved FROM {image}"
            tag = image.rsplit("/", 1)[-1].partition(":")[2]
            assert tag and tag != "latest", f"{name}: pin a tag, not {image!r}"
    pip = [rest for word, rest in ins if word == "RUN" and "pip install" in rest]
    assert len(pip) == 1, f"{name}: expected one pip install"
    assert f'".[{DOCKERFILES[name]}]"' in pip[0], f"{name}: installs the wrong extra"
    assert "ray[serve]==" in pip[0], f"{name}: Ray must be pinned to the cluster's version"
    users = [rest for word, rest in ins if word == "USER"]
    assert users and users[-1] not in ("root", "0"), f"{name}: must end as a non-root USER"
    exposed = {p for word, rest in ins if word == "EXPOSE" for p in rest.split()}
    assert "8000" in exposed, f"{name}: EXPOSE 8000 (Serve HTTP)"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_copies_exist_and_pass_the_dockerignore(name: str) -> None:
    ignore = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
    allowed = {line[1:].strip() for line in ignore if line.startswith("!")}
    assert "*" in [line.strip() for line in ignore], "the context must be an allow-list"
    for src in _copy_sources(_instructions(DOCKER / name)):
        assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path"
        assert src.rstrip("/") in allowed, f"{name}: COPY {src} is excluded from the context"


# --- docs -----------------------------------------------------------------------------


@pytest.mark.parametrize("doc", ["deploy.md", "scale-out.md"])
def test_docs_reference_existing_files(doc: str) -> None:
    text = (ROOT / "docs" / doc).read_text()
    paths = set(re.findall(r"`((?:deploy|docs|ops)/[\w./-]+\.(?:yaml|yml|md|py|json))`", text))
    assert paths, f"{doc}: no file references found"
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_ray_pods_run_restricted() -> None:
    """Every Ray pod runs as the images' non-root user with no privilege
    escalation, no capabilities and the runtime's seccomp profile; the CPU pods (head,
    routers) have a read-only root filesystem with /tmp and the home as emptyDirs."""
    rc = _rayservice()["spec"]["rayClusterConfig"]
    groups = {"head": rc["headGroupSpec"], **_worker_groups()}
    for name, group in groups.items():
        pod = group["template"]["spec"]
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] and isinstance(ctx["runAsUser"], int) and ctx["runAsUser"]
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"]:
            sec = container["securityContext"]
            assert sec["allowPrivilegeEscalation"] is False, name
            assert sec["capabilities"]["drop"] == ["ALL"], name
            if container["image"].endswith("-cpu"):
                assert sec["readOnlyRootFilesystem"] is True, name
                mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
                empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
                assert {"/tmp", "/home/ray"} <= set(mounts), name
                assert {mounts["/tmp"], mounts["/home/ray"]} <= empty, name
    auto = rc["autoscalerOptions"]["securityContext"]
    assert auto["allowPrivilegeEscalation"] is False and auto["capabilities"]["drop"] == ["ALL"]
    uid = {int(m) for m in re.findall(r"--uid (\d+)", (DOCKER / "Dockerfile.cpu").read_text())}
    assert uid == {groups["head"]["template"]["spec"]["securityContext"]["runAsUser"]}
