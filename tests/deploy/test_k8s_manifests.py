"""The kustomize overlays (deploy/k8s/dev, deploy/k8s/gpu, deploy/k8s/elastic), rendered
offline with `kubectl kustomize` and checked object by object: Kubernetes' OpenAPI schemas
(strict, via kubernetes-validate's bundled schemas), our own schemas of the Prometheus
Operator objects (KEDA's ScaledObject: test_k8s_elastic.py, against KEDA's own CRD),
and the rules the deployment promises — requests and limits everywhere, probes, PDBs,
non-root, no secret values, scraping, generated monitoring objects up to date, and a run
config whose addresses, ports and paths agree with the manifests. The manifest smoke run
(test_k8s_smoke.py) then starts the rendered dev overlay for real."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from actors.config import ActorConfig
from broker.config import BrokerConfig
from broker.server import nats_server_binary
from deploy import cluster, k8s_monitoring, observability
from deploy.prepare import PrepareConfig
from envservers.config import EnvServerConfig
from learner.config import LearnerConfig

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = cluster.OVERLAYS
K8S_VERSIONS = ("1.30", "1.37")  # the oldest we support, and the newest schemas shipped
WORKLOADS = ("Deployment", "StatefulSet", "Job")
ROLES = ("learner", "actor", "envserver")

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, cluster.render(request.param)


def _of(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = _of(objects, kind, name)
    return found


def _pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def _containers(workload: dict, *, init: bool = True) -> list[dict]:
    spec = _pod_spec(workload)
    return spec["containers"] + (spec.get("initContainers", []) if init else [])


def _component(workload: dict) -> str:
    return workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def _role_workload(objects: list[dict], role: str) -> dict:
    (found,) = [o for o in objects if o["kind"] in WORKLOADS and _component(o) == role]
    return found


def _port(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


def _run_config(objects: list[dict]) -> dict:
    (config,) = [
        o for o in _of(objects, "ConfigMap") if o["metadata"]["name"].startswith("tether-config-")
    ]
    return tomllib.loads(config["data"]["tether.toml"])


# ---- schemas ------------------------------------------------------------------------------------


def test_both_overlays_render_and_hold_every_part(rendered):
    _, objects = rendered
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in [
        ("StatefulSet", "tether-nats"),
        ("Deployment", "tether-envserver"),
        ("Deployment", "tether-actor"),
        ("Job", "tether-learner"),
        ("Service", "tether-learner"),
        ("PodMonitor", "tether"),
        ("PrometheusRule", "tether-alerts"),
        ("ConfigMap", "tether-grafana-dashboard"),
    ]:
        assert expected in kinds
    assert {o["metadata"].get("namespace") for o in objects} == {cluster.NAMESPACE}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kubernetes_object_validates_strictly(rendered, version):
    _, objects = rendered
    for obj in objects:
        if obj["apiVersion"].startswith(cluster.MONITORING_GROUP):
            continue  # CRDs: next test
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # KEDA's own CRD schema: test_k8s_elastic.py
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} (k8s {version}): {e}")


_DURATION = {"type": "string", "pattern": r"^(0|(\d+(ms|s|m|h|d|w|y))+)$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
}
# The fields of monitoring.coreos.com/v1 we use, as the Prometheus Operator's CRDs define
# them; anything else (a typo, a field of another version) fails.
CRD_SCHEMAS = {
    "PrometheusRule": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["groups"],
                "properties": {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name", "rules"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "interval": _DURATION,
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["expr"],
                                        "oneOf": [
                                            {"required": ["alert"]},
                                            {"required": ["record"]},
                                        ],
                                        "properties": {
                                            "alert": {"type": "string"},
                                            "record": {"type": "string"},
                                            "expr": {"type": ["string", "integer"]},
                                            "for": _DURATION,
                                            "keep_firing_for": _DURATION,
                                            "labels": _STRING_MAP,
                                            "annotations": _STRING_MAP,
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
    },
    "PodMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", "podMetricsEndpoints"],
                "properties": {
                    "jobLabel": {"type": "string"},
                    "selector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"matchLabels": _STRING_MAP},
                    },
                    "podMetricsEndpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["port"],
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string", "pattern": "^/"},
                                "interval": _DURATION,
                                "scrapeTimeout": _DURATION,
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_prometheus_operator_objects_match_their_crds(rendered):
    _, objects = rendered
    monitoring = [o for o in objects if o["apiVersion"].startswith(cluster.MONITORING_GROUP)]
    assert sorted(o["kind"] for o in monitoring) == ["PodMonitor", "PrometheusRule"] + [
        "PrometheusRule"
    ]
    for obj in monitoring:
        jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])


def test_the_crd_schemas_catch_mistakes():
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "x"},
        "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "1", "for": "5 m"}]}]},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, CRD_SCHEMAS["PrometheusRule"])  # not a duration
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "podMetricsEndpoints": [{"port": "metrics", "targetPort": 1}]},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, CRD_SCHEMAS["PodMonitor"])  # a ServiceMonitor field


# ---- what every workload promises ----------------------------------------------------------------


def test_every_container_has_requests_and_limits(rendered):
    overlay, objects = rendered
    for workload in (o for o in objects if o["kind"] in WORKLOADS):
        for container in _containers(workload):
            resources = container.get("resources", {})
            where = f"{overlay}: {workload['metadata']['name']}/{container['name']}"
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), where
            gpus = resources["limits"].get("nvidia.com/gpu")
            assert resources["requests"].get("nvidia.com/gpu") == gpus, where
            if overlay == "dev":
                assert gpus is None, where


def test_gpu_overlay_gives_gpus_to_the_learner_and_the_actors():
    objects = cluster.render("gpu")
    learner = _one(objects, "Job", "tether-learner")
    (container,) = _containers(learner)
    env = {e["name"]: e.get("value") for e in container["env"]}
    nodes, procs = int(env["TETHER_LEARNER_NODES"]), int(env["TETHER_LEARNER_PROCS_PER_NODE"])
    assert learner["spec"]["completions"] == learner["spec"]["parallelism"] == nodes
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == procs == 8
    assert {"NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"} <= set(env)
    assert _run_config(objects)["learner"]["nproc"] == nodes * procs
    (actor,) = _containers(_one(objects, "Deployment", "tether-actor"))
    assert actor["resources"]["limits"]["nvidia.com/gpu"] == "1"
    config = _run_config(objects)
    assert config["actor"]["engine"].get("tensor_parallel_size", 1) == 1


def test_role_containers_have_their_probes(rendered):
    _, objects = rendered
    envserver = _containers(_role_workload(objects, "envserver"), init=False)[0]
    for probe in ("readinessProbe", "livenessProbe"):
        assert envserver[probe]["grpc"]["port"] == _port(envserver, "grpc")
    for role in ("actor", "learner"):
        container = _containers(_role_workload(objects, role), init=False)[0]
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    nats = _containers(_one(objects, "StatefulSet", "tether-nats"), init=False)[0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert nats[probe]["httpGet"]["path"].startswith("/healthz")


def test_a_disruption_budget_guards_every_workload(rendered):
    _, objects = rendered
    budgets = _of(objects, "PodDisruptionBudget")
    for workload in (o for o in objects if o["kind"] in WORKLOADS):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, workload["metadata"]["name"]
    assert _one(objects, "PodDisruptionBudget", "tether-learner")["spec"]["maxUnavailable"] == 0


def test_everything_runs_as_non_root_without_privileges(rendered):
    _, objects = rendered
    for workload in (o for o in objects if o["kind"] in WORKLOADS):
        pod = _pod_spec(workload)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0
        assert pod["seccompProfile"]["type"] == "RuntimeDefault"
        for container in _containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert context.get("privileged") is not True


SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|CREDENTIAL", re.I)


def test_no_secret_values_anywhere(rendered):
    _, objects = rendered
    assert not _of(objects, "Secret")  # created in the cluster (make cluster-up, or by hand)
    for workload in (o for o in objects if o["kind"] in WORKLOADS):
        for container in _containers(workload):
            for env in container.get("env", []):
                if SECRETISH.search(env["name"]) or env["name"] == "NATS_USER":
                    assert "value" not in env, env
                    assert "secretKeyRef" in env["valueFrom"], env
    for path in (REPO / "deploy" / "k8s").rglob("*"):
        if path.is_file():
            for line in path.read_text().splitlines():
                match = re.search(r"(password|token|api_key)\s*[:=]\s*(\S+)", line, re.I)
                assert match is None or match.group(2).startswith("$"), f"{path}: {line}"


# ---- monitoring ---------------------------------------------------------------------------------


def test_every_role_is_scraped_by_annotations_and_the_pod_monitor(rendered):
    _, objects = rendered
    monitor = _one(objects, "PodMonitor", "tether")["spec"]
    (endpoint,) = monitor["podMetricsEndpoints"]
    for role in (*ROLES, "nats"):
        workload = _role_workload(objects, role)
        template = workload["spec"]["template"]
        metrics = [c for c in _containers(workload, init=False) if "metrics" in _names(c)]
        assert len(metrics) == 1, role
        port = _port(metrics[0], endpoint["port"])
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] == endpoint["path"] == "/metrics"
        assert monitor["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        # The job label of its series: the names the alert rules and the dashboard use.
        assert template["metadata"]["labels"][monitor["jobLabel"]] == role


def _names(container: dict) -> set[str]:
    return {p["name"] for p in container.get("ports", [])}


def test_generated_monitoring_objects_are_up_to_date():
    for path, text in k8s_monitoring.generated().items():
        assert path.read_text() == text, f"{path} drifted: run python -m deploy.k8s_monitoring"


def test_rendered_rules_and_dashboard_are_the_plain_files(rendered):
    _, objects = rendered
    rule = _one(objects, "PrometheusRule", "tether-alerts")
    alerts = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    # The staleness bound the alert and the dashboard read is the overlay's own.
    run_rules = _one(objects, "PrometheusRule", "tether-run-rules")["spec"]["groups"]
    bound = observability.bound_of(_run_config(objects)["learner"])
    assert run_rules == observability.run_rules(*bound)["groups"]
    dashboard = _one(objects, "ConfigMap", "tether-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["tether.json"] == (REPO / "deploy/grafana/tether.json").read_text()


def test_promtool_accepts_the_rendered_rules(rendered, tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (make install-test)")
    _, objects = rendered
    groups = [
        group
        for name in ("tether-alerts", "tether-run-rules")
        for group in _one(objects, "PrometheusRule", name)["spec"]["groups"]
    ]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    subprocess.run(["promtool", "check", "rules", str(rules)], check=True, capture_output=True)


# ---- the run config agrees with the manifests ----------------------------------------------------


def test_run_config_validates_and_its_addresses_are_the_manifests(rendered):
    overlay, objects = rendered
    config = _run_config(objects)
    learner = LearnerConfig.model_validate(config["learner"])
    actor = ActorConfig.model_validate(config["actor"])
    envserver = EnvServerConfig.model_validate(config["envserver"])
    broker = BrokerConfig.model_validate(config["broker"])
    if "prepare" in config:
        PrepareConfig.model_validate(config["prepare"])

    learner_c = _containers(_role_workload(objects, "learner"), init=False)[0]
    actor_c = _containers(_role_workload(objects, "actor"), init=False)[0]
    env_c = _containers(_role_workload(objects, "envserver"), init=False)[0]
    assert learner.metrics_port == _port(learner_c, "metrics")
    assert learner.weight_sync.store_port == _port(learner_c, "weights")
    assert actor.metrics_port == _port(actor_c, "metrics")
    assert (envserver.port, envserver.metrics_port) == (
        _port(env_c, "grpc"),
        _port(env_c, "metrics"),
    )
    # Listening where probes and scrapers reach them, not on the pod's loopback.
    assert learner.metrics_host == actor.metrics_host == envserver.host == "0.0.0.0"

    services = {s["metadata"]["name"]: s for s in _of(objects, "Service")}
    (address,) = actor.env.addresses
    host, port = address.rsplit(":", 1)
    assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
    assert services[host]["spec"]["selector"]["app.kubernetes.io/component"] == "envserver"
    match = re.fullmatch(r"nats://([\w-]+):(\d+)", broker.url)
    assert match and int(match.group(2)) in [
        p["port"] for p in services[match.group(1)]["spec"]["ports"]
    ]

    # Paths: under a volume each container mounts.
    def mounted(container: dict, path: str) -> bool:
        return any(path.startswith(m["mountPath"] + "/") for m in container["volumeMounts"])

    for path in (
        learner.model_path,
        learner.train_data,
        learner.eval_data,
        learner.run_dir,
        learner.checkpoint.dir,
    ):
        assert mounted(learner_c, path), path
    assert mounted(actor_c, actor.engine.model)
    # Weight snapshots: the actors see the learner's run directory at the same path.
    assert any(m["mountPath"] == "/runs" for m in actor_c["volumeMounts"])
    assert learner.run_dir.startswith("/runs/")

    nats = _one(objects, "StatefulSet", "tether-nats")
    assert broker.stream_replicas <= nats["spec"]["replicas"]
    if overlay == "gpu":
        assert nats["spec"]["replicas"] == broker.stream_replicas == 3
        nats_conf = _nats_conf(objects)
        routes = re.findall(r"nats://(tether-nats-\d)\.tether-nats-headless:6222", nats_conf)
        assert routes == [f"tether-nats-{i}" for i in range(3)]


def _nats_conf(objects: list[dict]) -> str:
    (config,) = [
        o
        for o in _of(objects, "ConfigMap")
        if o["metadata"]["name"].startswith("tether-nats-config-")
    ]
    return config["data"]["nats.conf"]


def test_nats_image_is_the_server_version_the_tests_run(rendered):
    _, objects = rendered
    nats = _containers(_one(objects, "StatefulSet", "tether-nats"), init=False)[0]
    local = subprocess.run(
        [nats_server_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    version = re.search(r"v(\d+\.\d+\.\d+)", local).group(1)
    assert nats["image"] == f"nats:{version}-alpine"
