"""The Grafana dashboard's shape: a datasource variable used by every panel, a tidy grid,
the panels the runbook refers to, and only metric names the roles really export."""

from __future__ import annotations

import json
import re

import yaml

from deploy import observability
from deploy.grafana.dashboard import DASHBOARD_PATH, queries

BOARD = json.loads(DASHBOARD_PATH.read_text())
PANELS = [p for p in BOARD["panels"] if p["type"] != "row"]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_a_recent_schema_and_a_prometheus_datasource_variable():
    assert BOARD["schemaVersion"] >= 39
    assert BOARD["uid"] == "tether-overview"
    [variable] = BOARD["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    assert variable["name"] == "datasource"
    for panel in PANELS:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_ids_are_unique_and_panels_tile_the_grid_without_overlap():
    ids = [p["id"] for p in BOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in BOARD["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_the_panels_the_docs_name_are_there():
    titles = {p["title"] for p in PANELS}
    assert titles >= {
        "Policy version",
        "Reward mean",
        "Eval pass@1 per env",
        "Staleness of trained groups",
        "Tokens per second",
        "Learner time per step",
        "Trained vs dropped trajectories",
        "Env step latency per env (server side)",
        "Env errors by code",
        "Actor in-flight episodes and groups",
        "Generation stall per weight update",
        "Version lag",
        "Prompts pending",
        "Trajectories awaiting the learner",
        "Stream fill (share of its limit)",
        "Stream bytes vs limit",
    }


def _exported_series() -> set[str]:
    """Every series name the roles' metric modules can expose."""
    import prometheus_client

    import actors.metrics  # noqa: F401 - registers the actor's metrics
    import broker.trajectories  # noqa: F401
    import envservers.metrics  # noqa: F401
    import learner.metrics  # noqa: F401

    names = set()
    for family in prometheus_client.REGISTRY.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


def test_every_metric_name_in_a_query_or_rule_is_exported_or_recorded():
    exported = _exported_series()
    recorded = {r["record"] for r in observability.run_rules(1)["groups"][0]["rules"]}
    alerts = yaml.safe_load(observability.ALERTS_FILE.read_text())["groups"][0]["rules"]
    exprs = queries(BOARD) + [rule["expr"] for rule in alerts]
    used = {name for expr in exprs for name in re.findall(r"\btether[_:][a-z0-9_:]*", expr)}
    assert used, "no tether metric found in the queries"
    assert used - exported - recorded == set()
    # and every family the roles export that matters for a run is on the dashboard
    on_board = {name for expr in queries(BOARD) for name in re.findall(r"\btether_\w+", expr)}
    families = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in on_board}
    for name in exported:
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        roles = ("tether_learner_", "tether_bus_", "tether_env_", "tether_actor_", "tether_broker_")
        if base.startswith(roles):
            assert base in families, f"{name} is exported but on no panel"


def test_provisioning_points_grafana_at_the_prometheus_and_the_dashboard():
    root = DASHBOARD_PATH.parent / "provisioning"
    [source] = yaml.safe_load((root / "datasources" / "tether.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://127.0.0.1:9090"
    shipped = yaml.safe_load((observability.PROMETHEUS_DIR / "prometheus.yml").read_text())
    # Grafana's $__rate_interval is derived from this: it must be the real scrape interval.
    assert source["jsonData"]["timeInterval"] == shipped["global"]["scrape_interval"]
    [provider] = yaml.safe_load((root / "dashboards" / "tether.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "${TETHER_DASHBOARDS}"
