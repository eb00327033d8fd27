"""The shipped Prometheus files pass promtool, the alerts fire on hand-worked series
(tests/deploy/alerts_test.yml), and the committed generated files match their generators."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy import observability
from deploy.grafana import dashboard

PROMTOOL = shutil.which("promtool")
HERE = Path(__file__).resolve().parent
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (`apt-get install prometheus`)"
)


def _promtool(*args: str, cwd: Path = HERE) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_shipped_config_and_rules_pass_promtool():
    result = _promtool("check", "config", "prometheus.yml", cwd=observability.PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout
    result = _promtool(
        "check", "rules", "alerts.yml", "run_rules.yml", cwd=observability.PROMETHEUS_DIR
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 rules found" in result.stdout and "2 rules found" in result.stdout


@needs_promtool
def test_a_rendered_run_config_passes_promtool(tmp_path):
    ports = {"learner": 31000, "actor": 31100, "envserver": 31200}
    path = observability.render(ports, tmp_path, actor_replicas=3, max_staleness=4)
    result = _promtool("check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    result = _promtool("check", "rules", str(tmp_path / observability.RUN_RULES_NAME))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alerts_fire_as_worked_out_by_hand():
    result = _promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_an_auto_bounds_share_reads_the_bucket_below_the_bound_in_force(tmp_path):
    """An "auto" run's rules on hand-worked series: 20 groups/min trained, 2/min at
    staleness 0, 8/min at 1, 5/min at 2, 5/min at 3; the learner's bound is 2 for the first
    30 minutes, then 3. At 20m: 1 - (2 + 8)/20 = 0.5 at bound 2; at 50m (the rates are
    steady, so the window straddling the change does not matter): 1 - 15/20 = 0.25."""
    rules = tmp_path / observability.RUN_RULES_NAME
    rules.write_text(observability.to_yaml(observability.run_rules("auto", 4)))
    learner = 'job="learner", instance="l:1"'
    cumulative = (("0.0", 2), ("1.0", 10), ("2.0", 15), ("3.0", 20), ("+Inf", 20))
    series = {f'tether_learner_staleness_bucket{{{learner}, le="{le}"}}': f"0+{per_min}x60"
              for le, per_min in cumulative}  # fmt: skip
    series[f"tether_learner_staleness_count{{{learner}}}"] = "0+20x60"
    series[f"tether_learner_staleness_bound{{{learner}}}"] = "2x30 3x30"

    def sample(record: str, minute: int, value: float) -> dict:
        return {"expr": record, "eval_time": f"{minute}m",
                "exp_samples": [{"labels": record, "value": value}]}  # fmt: skip

    share = "tether:learner_staleness_at_bound:ratio_rate15m"
    bound = "tether:learner_max_staleness"
    case = {
        "interval": "1m",
        "input_series": [{"series": name, "values": values} for name, values in series.items()],
        "promql_expr_test": [
            sample(share, 20, 0.5),
            sample(bound, 20, 2),
            sample(share, 50, 0.25),
            sample(bound, 50, 3),
        ],  # fmt: skip
    }
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [case]}
    (tmp_path / "auto_test.yml").write_text(yaml.safe_dump(tests))
    result = _promtool("test", "rules", "auto_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_case_and_a_severity():
    alerts = yaml.safe_load(observability.ALERTS_FILE.read_text())["groups"][0]["rules"]
    cases = yaml.safe_load((HERE / "alerts_test.yml").read_text())["tests"]
    tested = {t["alertname"] for case in cases for t in case.get("alert_rule_test", [])}
    assert {rule["alert"] for rule in alerts} == tested
    for rule in alerts:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_committed_files_match_their_generators():
    for path, text in observability.shipped_files().items():
        assert path.read_text() == text, (
            f"{path} drifted: python -m deploy.observability --write-shipped"
        )
    assert json.loads(dashboard.DASHBOARD_PATH.read_text()) == dashboard.dashboard(), (
        "deploy/grafana/tether.json drifted: python -m deploy.grafana.dashboard"
    )
