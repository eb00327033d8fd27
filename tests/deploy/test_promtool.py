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
