"""The Kubernetes form of an elastic actor fleet (deploy/k8s/elastic), rendered from the
overlay's run config so that every number has one source, common/fleet.py's rule:

    deploy/k8s/elastic/tether.toml  ->  elastic/actor.yaml          the actors' grace period
      [elastic], [learner], [actor]     elastic/keda/scaledobject.yaml  KEDA ScaledObject
                                        elastic/hpa/hpa.yaml            autoscaling/v2 HPA
                                        elastic/hpa/prometheus-adapter-values.yaml
                                            (the adapter's rule for the HPA's External metric)

    python -m deploy.k8s_elastic            write them
    python -m deploy.k8s_elastic --check    exit 1 if any is out of date
    ... --overlay DIR                       your copy of the overlay instead (e.g. on ../gpu)

Both autoscalers ask for `ceil(signal / groups_per_replica)` replicas within the fleet's
bounds (an `AverageValue` target of `groups_per_replica`), where the signal is common/fleet.py's
`max(sustained, held)` written in PromQL over `work` = pending + ack_pending of the prompts
queue: `min_over_time` of its last `scale_up_after_s` and `avg_over_time` of its last
`scale_down_after_s` (subqueries). The HPA grows at once (no scale-up window: the sustain is
in the query) and shrinks to the highest recommendation of its last `scale_down_after_s`,
which is `FleetSizer`. Two differences are the HPA's own: it ignores a change within 10% of
the current size (its tolerance), and it reads the metric every 15 s (its sync period).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from common.fleet import FleetBounds, leave_grace_s
from deploy.cluster import NAMESPACE
from deploy.config import RunConfig, load_run_config
from deploy.k8s_monitoring import dump_yaml

DEPLOY = Path(__file__).resolve().parent
OVERLAY = DEPLOY / "k8s" / "elastic"
ACTOR = "tether-actor"
PROMETHEUS_HOST, PROMETHEUS_PORT = "http://kube-prometheus-stack-prometheus.monitoring.svc", 9090
"""kube-prometheus-stack's Prometheus Service (the chart the PodMonitor is labelled for)."""
EXTERNAL_METRIC = "tether_prompts_work"
"""The name prometheus-adapter serves the work under (external.metrics.k8s.io)."""
POLICY_PERIOD_S = 15
"""The HPA's rate-limit period: every change the windows allow is made at once (below)."""
MAX_WINDOW_S = 3600  # the API's bound on stabilizationWindowSeconds
SUBQUERY_STEP_S = 5
"""The signal's subquery resolution: the learner's bus poll (learner/bus_metrics.py)."""


def work_query(label_matchers: str) -> str:
    """PromQL for pending + ack_pending of the prompts queue, as the learner exports them
    (learner/metrics.py); `max`: one value however many learner series there are."""
    matchers = f'{label_matchers}, job="learner", queue="prompts"'
    return (
        f"max(tether_bus_pending_messages{{{matchers}}})"
        f" + max(tether_bus_ack_pending_messages{{{matchers}}})"
    )


def signal_query(label_matchers: str, bounds: FleetBounds) -> str:
    """common/fleet.py's `max(sustained, held)`: the lowest work of the up window and its
    mean over the down window (`(a >= b) or b` is the larger of two label-less values)."""
    work = work_query(label_matchers)
    up = max(_window_s(bounds.scale_up_after_s, "scale_up_after_s"), SUBQUERY_STEP_S)
    down = max(_window_s(bounds.scale_down_after_s, "scale_down_after_s"), SUBQUERY_STEP_S)
    sustained = f"min_over_time(({work})[{up}s:{SUBQUERY_STEP_S}s])"
    held = f"avg_over_time(({work})[{down}s:{SUBQUERY_STEP_S}s])"
    return f"({sustained}\n  >= {held})\nor {held}"


def termination_grace_s(run: RunConfig) -> int:
    """The actor pod's terminationGracePeriodSeconds: the replica's drain, then its exit."""
    assert run.actor is not None, "load_run_config of an elastic overlay: [actor] is required"
    return leave_grace_s(run.actor.drain_timeout_s)


def _window_s(seconds: float, key: str) -> int:
    window = math.ceil(seconds)
    if window > MAX_WINDOW_S:
        raise ValueError(
            f"elastic.{key} ({seconds}) is over {MAX_WINDOW_S} s, the longest stabilization "
            "window Kubernetes' HPA allows"
        )
    return window


def behavior(bounds: FleetBounds) -> dict:
    """The HPA's behavior: up at once (the signal's sustain is in its query), down to the
    highest recommendation of common/fleet.py's down window, and no rate limit inside them
    (a policy allowing the whole range per period), as FleetSizer jumps straight to its size."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": bounds.max_replicas, "periodSeconds": POLICY_PERIOD_S}
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": _window_s(
                bounds.scale_down_after_s, "scale_down_after_s"
            ),
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": POLICY_PERIOD_S}],
        },
    }


def _bounds(run: RunConfig) -> FleetBounds:
    if not run.elastic.enabled:
        raise ValueError("the elastic overlay's tether.toml must set [elastic] enabled = true")
    return run.fleet_bounds()


def scaled_object(run: RunConfig) -> dict:
    """KEDA's ScaledObject for the actor Deployment (a Prometheus trigger)."""
    bounds = _bounds(run)
    trigger = {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": f"{PROMETHEUS_HOST}:{PROMETHEUS_PORT}",
            "query": signal_query(f'namespace="{NAMESPACE}"', bounds),
            "threshold": str(bounds.groups_per_replica),
            # No learner series (not started, finished, not scraped): an error, on which the
            # HPA keeps the size it has, instead of a zero that would shrink the fleet.
            "ignoreNullValues": "false",
        },
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": ACTOR},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": ACTOR},
            "minReplicaCount": bounds.min_replicas,
            "maxReplicaCount": bounds.max_replicas,
            # How often KEDA itself reads the trigger: the learner's bus poll, no faster.
            "pollingInterval": max(math.ceil(run.elastic.poll_s), 1),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(bounds)}},
            "triggers": [trigger],
        },
    }


def horizontal_pod_autoscaler(run: RunConfig) -> dict:
    """The same sizing as a plain autoscaling/v2 HPA on an External metric."""
    bounds = _bounds(run)
    metric = {
        "type": "External",
        "external": {
            "metric": {"name": EXTERNAL_METRIC},
            "target": {"type": "AverageValue", "averageValue": str(bounds.groups_per_replica)},
        },
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": ACTOR},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": ACTOR},
            "minReplicas": bounds.min_replicas,
            "maxReplicas": bounds.max_replicas,
            "metrics": [metric],
            "behavior": behavior(bounds),
        },
    }


def adapter_values(run: RunConfig) -> dict:
    """prometheus-adapter's Helm values (`rules.external`) serving EXTERNAL_METRIC. The
    adapter adds the HPA's namespace to <<.LabelMatchers>>."""
    rule = {
        "seriesQuery": 'tether_bus_pending_messages{namespace!="", job="learner", queue="prompts"}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "name": {"matches": "^tether_bus_pending_messages$", "as": EXTERNAL_METRIC},
        "metricsQuery": signal_query("<<.LabelMatchers>>", _bounds(run)),
    }
    prometheus = {"url": PROMETHEUS_HOST, "port": PROMETHEUS_PORT}
    return {"prometheus": prometheus, "rules": {"external": [rule]}}


def actor_patch(run: RunConfig) -> dict:
    """The actor Deployment under an autoscaler: its grace fits the leave protocol, and it
    names no replica count (each `kubectl apply` would reset the autoscaler's to it)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": ACTOR},
        "spec": {
            "replicas": None,  # a strategic-merge null: the field is removed
            "template": {"spec": {"terminationGracePeriodSeconds": termination_grace_s(run)}},
        },
    }


def generated(overlay: Path = OVERLAY) -> dict[Path, str]:
    """Every generated file of the overlay at `overlay`, from its tether.toml."""
    config = overlay / "tether.toml"
    run = load_run_config(config)
    header = (
        f"# Generated by `python -m deploy.k8s_elastic` from {_shown(config)}:\n"
        "# edit that file, then run it again.\n"
    )
    return {
        overlay / "actor.yaml": header + ACTOR_NOTE + dump_yaml(actor_patch(run)),
        overlay / "keda" / "scaledobject.yaml": header + dump_yaml(scaled_object(run)),
        overlay / "hpa" / "hpa.yaml": header + dump_yaml(horizontal_pod_autoscaler(run)),
        overlay / "hpa" / "prometheus-adapter-values.yaml": (
            header + ADAPTER_NOTE + dump_yaml(adapter_values(run))
        ),
    }


ACTOR_NOTE = """\
# terminationGracePeriodSeconds: actor.drain_timeout_s + LEAVE_MARGIN_S (common/fleet.py).
# `replicas: null` removes the base's count: the autoscaler owns it.
"""
ADAPTER_NOTE = """\
# Helm values of prometheus-community/prometheus-adapter, which serve the HPA's External
# metric: helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter
#   -n monitoring -f deploy/k8s/elastic/hpa/prometheus-adapter-values.yaml
# (merge `rules.external` into the values you already have).
"""


def _shown(path: Path) -> str:
    """The config's path as the header names it: from the repository when it is in it."""
    return str(path.relative_to(DEPLOY.parent)) if path.is_relative_to(DEPLOY.parent) else path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.k8s_elastic", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report files out of date")
    parser.add_argument(
        "--overlay", type=Path, default=OVERLAY, help="an overlay laid out like deploy/k8s/elastic"
    )
    args = parser.parse_args(argv)
    files = generated(args.overlay.resolve())
    stale = [path for path, text in files.items() if _read(path) != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path} (run python -m deploy.k8s_elastic)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


if __name__ == "__main__":
    sys.exit(main())
