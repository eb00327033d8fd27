"""The elastic overlay (deploy/k8s/elastic): an actor fleet sized by common/fleet.py's rule,
through KEDA or a plain HPA, optionally on spot nodes. Rendered offline with `kubectl
kustomize` (the shipped overlay; its other components in a copy of deploy/k8s with the
overlay's component list changed, as a user would change it); the ScaledObject checked
against KEDA's own CRD schema (vendored: tests/deploy/schemas/), strict like a server's
field validation; the HPA and the rest against Kubernetes' schemas (kubernetes-validate);
every number against the generator's pure functions and worked examples.

Not checked here: `kubectl create --dry-run=client` and `kubectl apply --dry-run=client` both
need an API server even in client mode (kubectl maps each kind to its resource through the
server's discovery; without one they fail with "unable to recognize ... connection refused"),
so there is none of that; KEDA's CEL rule (minReplicaCount <= maxReplicaCount), which
jsonschema cannot read, is checked by hand; what KEDA and the HPA controller then do with
the objects needs a cluster."""

from __future__ import annotations

import math
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from common.fleet import LEAVE_MARGIN_S, FleetSizer
from deploy import cluster, k8s_elastic
from deploy.config import load_run_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = k8s_elastic.OVERLAY / "tether.toml"
KEDA_CRD = Path(__file__).parent / "schemas" / "keda.sh_scaledobjects.yaml"
K8S_VERSIONS = ("1.30", "1.37")
SPOT_TAINTS = {"cloud.google.com/gke-spot", "kubernetes.azure.com/scalesetpriority"}
WORKLOADS_OFF_SPOT = [
    ("Job", "tether-learner"),
    ("StatefulSet", "tether-nats"),
    ("Deployment", "tether-envserver"),
]

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")


def _render(directory: Path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _variant(tmp_path: Path, *, components: list[str], config_edits=()) -> list[dict]:
    """The elastic overlay rendered from a copy of deploy/k8s with its component list (and
    optionally its tether.toml, by (old, new) text replacements) changed, generated files
    written again from that copy's config."""
    k8s = tmp_path / "k8s"
    shutil.copytree(REPO / "deploy" / "k8s", k8s)
    overlay = k8s / "elastic"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["components"] = components
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    config = (overlay / "tether.toml").read_text()
    for old, new in config_edits:
        assert old in config
        config = config.replace(old, new)
    (overlay / "tether.toml").write_text(config)
    for path, text in k8s_elastic.generated(overlay).items():
        path.write_text(text)
    return _render(overlay)


def _of(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in _of(objects, kind) if o["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def shipped() -> list[dict]:
    return _render(k8s_elastic.OVERLAY)


@pytest.fixture(scope="module")
def keda_schema() -> dict:
    """The openAPIV3Schema of KEDA's ScaledObject CRD, strict: an object with named
    properties takes no others, as an API server's strict field validation (kubectl's
    default) refuses unknown fields of a custom resource."""
    crd = yaml.safe_load(KEDA_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def _strict(node):
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _strict(value) for key, value in node.items()}
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    return node


# ---- the overlay as shipped (KEDA) ---------------------------------------------------------


def test_the_overlay_renders_the_dev_run_with_keda_and_an_elastic_config(shipped):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in shipped}
    assert ("ScaledObject", "tether-actor") in kinds
    assert ("Job", "tether-learner") in kinds and ("StatefulSet", "tether-nats") in kinds
    assert not _of(shipped, "HorizontalPodAutoscaler")  # KEDA makes its own
    assert {o["metadata"].get("namespace") for o in shipped} == {cluster.NAMESPACE}
    (config,) = [
        o for o in _of(shipped, "ConfigMap") if o["metadata"]["name"].startswith("tether-config-")
    ]
    assert tomllib.loads(config["data"]["tether.toml"])["elastic"]["enabled"] is True
    # The autoscaler owns the replica count: an apply must not reset it.
    assert "replicas" not in _one(shipped, "Deployment", "tether-actor")["spec"]


def test_the_config_is_the_dev_runs_plus_the_elastic_section():
    elastic = tomllib.loads(CONFIG.read_text())
    dev = tomllib.loads((REPO / "deploy/k8s/dev/tether.toml").read_text())
    assert elastic.pop("elastic")["enabled"] is True
    assert elastic == dev, "edit deploy/k8s/elastic/tether.toml like deploy/k8s/dev/tether.toml"
    run = load_run_config(CONFIG)
    assert run.elastic.engine_start_s >= 60  # a real cluster: a node, an image, an engine


def test_the_scaled_object_passes_kedas_crd_schema(shipped, keda_schema):
    (scaled,) = _of(shipped, "ScaledObject")
    jsonschema.validate(scaled, keda_schema)
    spec = scaled["spec"]
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]  # the CRD's CEL rule


def test_kedas_schema_catches_a_broken_scaled_object(shipped, keda_schema):
    (scaled,) = _of(shipped, "ScaledObject")
    broken = yaml.safe_load(yaml.safe_dump(scaled))
    broken["spec"]["minReplicaCount"] = "1"  # a string
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, keda_schema)
    broken = yaml.safe_load(yaml.safe_dump(scaled))
    broken["spec"]["maxReplicas"] = broken["spec"].pop("maxReplicaCount")  # the HPA's name
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.validate(broken, keda_schema)
    broken = yaml.safe_load(yaml.safe_dump(scaled))
    del broken["spec"]["triggers"][0]["type"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, keda_schema)


def test_the_scaled_object_is_the_fleet_rule(shipped):
    """dev's numbers: an "auto" bound up to its limit 4, so (4 + 1) * 8 prompts = 40 groups
    released at most; an engine of 64 sequences holds 64 // 8 = 8 groups; so 1 to
    ceil(40 / 8) = 5 replicas."""
    spec = _one(shipped, "ScaledObject", "tether-actor")["spec"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    bounds = load_run_config(CONFIG).fleet_bounds()
    assert trigger["metadata"]["query"] == k8s_elastic.signal_query('namespace="tether"', bounds)
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    threshold = int(trigger["metadata"]["threshold"])
    assert (threshold, spec["minReplicaCount"], spec["maxReplicaCount"]) == (8, 1, 5)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0  # the sustain is in the query
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert "cooldownPeriod" not in spec  # scale to zero only, which min_replicas >= 1 refuses

    # The HPA's AverageValue arithmetic on an external metric, ceil(value / target) within
    # the bounds, is FleetBounds.replicas_for (worked: 9 groups need a second replica).
    for work, expected in [(0, 1), (8, 1), (9, 2), (16, 2), (33, 5), (100, 5)]:
        hpa = min(max(math.ceil(work / threshold), spec["minReplicaCount"]), 5)
        assert hpa == bounds.replicas_for(work) == expected


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (`apt-get install prometheus`)"
)
def test_the_query_computes_the_sizers_signal_in_prometheus(tmp_path):
    """Prometheus itself (promtool's rule tests) evaluates the trigger's query over a worked
    series, a step's releases every 10 s for ten minutes then a stretch of full windows, and
    gets FleetSizer.signal of the same readings: the mean where releases come and go (held),
    the lowest of the last minute once the window stays full (sustained)."""
    bounds = load_run_config(CONFIG).fleet_bounds()  # up 60 s, down 600 s
    work = [12 if i % 2 == 0 else 0 for i in range(120)] + [16] * 40  # every 5 s
    sizer = FleetSizer(bounds, replicas=1, now=0.0)
    signal = {}
    for i, w in enumerate(work):
        sizer.observe(i * 5.0, w)
        signal[i * 5] = sizer.signal(i * 5.0)
    assert (signal[595], signal[700], signal[795]) == (6.0, 16.0, 16.0)

    labels = '{namespace="tether", job="learner", queue="prompts"}'
    query = k8s_elastic.signal_query('namespace="tether"', bounds)
    case = {
        "interval": "5s",
        "input_series": [
            {"series": f"tether_bus_pending_messages{labels}", "values": " ".join(map(str, work))},
            {"series": f"tether_bus_ack_pending_messages{labels}", "values": f"0x{len(work) - 1}"},
        ],
        "promql_expr_test": [
            {"expr": query, "eval_time": f"{at}s", "exp_samples": [{"labels": "{}", "value": v}]}
            for at, v in ((595, signal[595]), (700, signal[700]), (795, signal[795]))
        ],
    }
    path = tmp_path / "signal_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": [case]}))
    out = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_generated_files_are_up_to_date():
    for path, text in k8s_elastic.generated().items():
        assert path.read_text() == text, f"{path} drifted: run python -m deploy.k8s_elastic"
    assert k8s_elastic.main(["--check"]) == 0


# ---- numbers follow the config --------------------------------------------------------------


def test_max_staleness_sets_the_largest_fleet():
    """max_staleness 3: (3 + 1) * 8 = 32 groups released, over 8 per replica: 4 replicas;
    "auto" is sized for its limit (4 as shipped: 5 replicas; 2: 3 replicas)."""
    cases = [([], 5), (["learner.max_staleness=3"], 4), (["learner.max_staleness=1"], 2),
             (["learner.max_staleness_limit=2"], 3)]  # fmt: skip
    for overrides, expected in cases:
        run = load_run_config(CONFIG, overrides)
        assert k8s_elastic.scaled_object(run)["spec"]["maxReplicaCount"] == expected
        assert k8s_elastic.horizontal_pod_autoscaler(run)["spec"]["maxReplicas"] == expected
    capped = load_run_config(CONFIG, ["learner.max_staleness=3", "elastic.max_replicas=3"])
    assert k8s_elastic.scaled_object(capped)["spec"]["maxReplicaCount"] == 3


def test_the_grace_period_follows_the_drain_timeout():
    for drain_s, expected in [(30, 30 + LEAVE_MARGIN_S), (45.5, 46 + 60)]:
        run = load_run_config(CONFIG, [f"actor.drain_timeout_s={drain_s}"])
        assert k8s_elastic.termination_grace_s(run) == expected
        patch = k8s_elastic.actor_patch(run)["spec"]["template"]["spec"]
        assert patch["terminationGracePeriodSeconds"] == expected


def test_a_changed_config_renders_into_the_objects(tmp_path):
    objects = _variant(
        tmp_path,
        components=["keda"],
        config_edits=[
            ('max_staleness = "auto"', "max_staleness = 3"),
            ("[actor]\n", "[actor]\ndrain_timeout_s = 100\n"),
        ],
    )
    assert _one(objects, "ScaledObject", "tether-actor")["spec"]["maxReplicaCount"] == 4
    actor = _one(objects, "Deployment", "tether-actor")["spec"]["template"]["spec"]
    assert actor["terminationGracePeriodSeconds"] == 100 + LEAVE_MARGIN_S


def test_the_generator_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="enabled = true"):
        k8s_elastic.scaled_object(load_run_config(CONFIG, ["elastic.enabled=false"]))
    too_long = load_run_config(CONFIG, ["elastic.scale_down_after_s=4000"])
    with pytest.raises(ValueError, match="scale_down_after_s"):
        k8s_elastic.horizontal_pod_autoscaler(too_long)


# ---- without KEDA: the HPA ------------------------------------------------------------------


@pytest.fixture(scope="module")
def with_hpa(tmp_path_factory) -> list[dict]:
    return _variant(tmp_path_factory.mktemp("hpa"), components=["hpa"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_hpa_variant_validates_strictly(with_hpa, version):
    assert not _of(with_hpa, "ScaledObject")
    for obj in with_hpa:
        if obj["apiVersion"].startswith(cluster.MONITORING_GROUP):
            continue  # the Prometheus Operator's CRDs: test_k8s_manifests.py
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_hpa_sizes_as_the_scaled_object_does(with_hpa, shipped):
    hpa = _one(with_hpa, "HorizontalPodAutoscaler", "tether-actor")["spec"]
    scaled = _one(shipped, "ScaledObject", "tether-actor")["spec"]
    assert hpa["scaleTargetRef"] == scaled["scaleTargetRef"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (
        scaled["minReplicaCount"],
        scaled["maxReplicaCount"],
    )
    assert hpa["behavior"] == scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    (metric,) = hpa["metrics"]
    assert metric["external"]["metric"]["name"] == k8s_elastic.EXTERNAL_METRIC
    assert metric["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": scaled["triggers"][0]["metadata"]["threshold"],
    }
    # prometheus-adapter serves that metric with the ScaledObject's query, the HPA's
    # namespace in place of the literal one.
    adapter = k8s_elastic.OVERLAY / "hpa" / "prometheus-adapter-values.yaml"
    values = yaml.safe_load(adapter.read_text())
    (rule,) = values["rules"]["external"]
    assert rule["name"]["as"] == k8s_elastic.EXTERNAL_METRIC
    served = rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="tether"')
    assert served == scaled["triggers"][0]["metadata"]["query"]


# ---- spot nodes -----------------------------------------------------------------------------


def test_the_spot_variant_puts_only_actors_on_spot_and_never_blocks_a_reclaim(tmp_path):
    objects = _variant(tmp_path, components=["keda", "spot"])
    for version in K8S_VERSIONS:
        for obj in objects:
            if obj["kind"] in ("Deployment", "PodDisruptionBudget"):
                kubernetes_validate.validate(obj, version, strict=True)
    actor = _one(objects, "Deployment", "tether-actor")["spec"]["template"]["spec"]
    assert SPOT_TAINTS <= {t["key"] for t in actor["tolerations"]}
    preferred = actor["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    labels = {e["key"] for p in preferred for e in p["preference"]["matchExpressions"]}
    assert {"cloud.google.com/gke-spot", "karpenter.sh/capacity-type"} <= labels
    budget = _one(objects, "PodDisruptionBudget", "tether-actor")["spec"]
    assert budget["maxUnavailable"] == "100%"  # every actor may be evicted at once
    for kind, name in WORKLOADS_OFF_SPOT:
        pod = _one(objects, kind, name)["spec"]["template"]["spec"]
        assert not {t["key"] for t in pod.get("tolerations", [])} & SPOT_TAINTS, name
    assert _one(objects, "PodDisruptionBudget", "tether-learner")["spec"]["maxUnavailable"] == 0
