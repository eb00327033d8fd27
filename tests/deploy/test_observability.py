"""deploy/observability.py: a run's metrics ports become scrape targets, and its staleness
bound becomes recording rules."""

from __future__ import annotations

import json

import pytest
import yaml

from deploy import observability

PORTS = {"learner": 9301, "actor": 9501, "envserver": 9401}


def test_scrape_config_has_one_target_per_actor_replica_on_consecutive_ports():
    config = observability.scrape_config(PORTS, actor_replicas=2, scrape_interval="5s")
    assert config == {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": ["alerts.yml", "run_rules.yml"],
        "scrape_configs": [
            {"job_name": "learner", "static_configs": [{"targets": ["127.0.0.1:9301"]}]},
            {
                "job_name": "actor",
                "static_configs": [
                    {"targets": ["127.0.0.1:9501"], "labels": {"replica": "0"}},
                    {"targets": ["127.0.0.1:9502"], "labels": {"replica": "1"}},
                ],
            },
            {"job_name": "envserver", "static_configs": [{"targets": ["127.0.0.1:9401"]}]},
        ],
    }


def test_actor_ports_from_a_list_a_count_key_or_one():
    assert observability.actor_ports({"actor": [7000, 7005]}, None) == [7000, 7005]
    assert observability.actor_ports({"actor": 7000, "actor_replicas": 3}, None) == [
        7000,
        7001,
        7002,
    ]
    assert observability.actor_ports({"actor": 7000, "actor_replicas": 3}, 1) == [7000]
    assert observability.actor_ports({"actor": 7000}, None) == [7000]


@pytest.mark.parametrize(
    ("ports", "replicas", "message"),
    [
        ({"learner": 1, "actor": 2}, 1, "missing ['envserver']"),
        ({**PORTS, "learner": "9300"}, 1, "learner must be a port number"),
        ({**PORTS, "envserver": 0}, 1, "envserver must be a port number"),
        ({**PORTS, "actor": [1, 2]}, 3, "2 actor ports given but actor_replicas=3"),
        (PORTS, 0, "actor_replicas must be at least 1"),
    ],
)
def test_bad_ports_are_a_value_error(ports, replicas, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        observability.scrape_config(ports, actor_replicas=replicas)


def test_run_rules_read_the_bucket_just_below_the_bound():
    rules = observability.run_rules(3)["groups"][0]["rules"]
    assert rules == [
        {"record": "tether:learner_max_staleness", "expr": "vector(3)"},
        {
            "record": "tether:learner_staleness_at_bound:ratio_rate15m",
            "expr": '1 - sum(rate(tether_learner_staleness_bucket{le="2.0"}[15m]))'
            " / sum(rate(tether_learner_staleness_count[15m]))",
        },
    ]


def test_run_rules_without_a_share_when_the_bound_is_0_or_past_the_buckets():
    # Bound 0: every group is "at the bound" by construction (the synchronous baseline).
    # Bound 10: no le="9.0" bucket to read (learner/metrics.py's buckets end at 8).
    for bound in (0, 10):
        rules = observability.run_rules(bound)["groups"][0]["rules"]
        assert rules == [{"record": "tether:learner_max_staleness", "expr": f"vector({bound})"}]
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        observability.run_rules(-1)


def test_an_auto_bound_is_the_learners_gauge_with_one_share_term_per_bound_it_can_take():
    rules = observability.run_rules("auto", 3)["groups"][0]["rules"]
    assert rules[0] == {
        "record": "tether:learner_max_staleness",
        "expr": "max(tether_learner_staleness_bound)",
    }
    share = rules[1]["expr"]
    for bound in (1, 2, 3):
        assert f'le="{bound - 1:.1f}"' in share
        assert f"max(tether_learner_staleness_bound) == {bound})" in share
    assert 'le="3.0"' not in share  # the limit: no term for a bound of 4
    with pytest.raises(ValueError, match="max_staleness_limit"):
        observability.run_rules("auto")
    with pytest.raises(ValueError, match='integer or "auto"'):
        observability.run_rules("sometimes")


def test_bucket_labels_match_what_prometheus_client_exposes():
    from prometheus_client import generate_latest

    from learner import metrics as learner_metrics

    exposed = generate_latest().decode()
    assert 'tether_learner_staleness_bucket{le="0.0"}' in exposed
    [family] = learner_metrics.STALENESS.collect()
    les = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
    assert les == [f"{b:.1f}" for b in range(observability.STALENESS_BUCKETS)] + ["+Inf"]


def test_cli_renders_a_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics_ports.json").write_text(json.dumps(PORTS))
    assert observability.main(["--run", str(run), "--actor-replicas", "2"]) == 0
    config = yaml.safe_load((run / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == [str(observability.ALERTS_FILE), "run_rules.yml"]
    actor = config["scrape_configs"][1]["static_configs"]
    assert [c["targets"] for c in actor] == [["127.0.0.1:9501"], ["127.0.0.1:9502"]]
    rules = yaml.safe_load((run / "prometheus" / "run_rules.yml").read_text())
    assert rules["groups"][0]["rules"][0]["expr"] == "vector(1)"  # the learner's default
    assert "--storage.tsdb.path=" in capsys.readouterr().out


def test_cli_reads_the_bound_the_run_was_launched_with(tmp_path, capsys):
    from deploy.frozen_config import freeze

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics_ports.json").write_text(json.dumps(PORTS))
    freeze(run, {"learner": {"max_staleness": "auto", "max_staleness_limit": 2}})

    def rules() -> list[dict]:
        return yaml.safe_load((run / "prometheus" / "run_rules.yml").read_text())["groups"][0][
            "rules"
        ]

    assert observability.main(["--run", str(run)]) == 0
    assert rules()[0]["expr"] == "max(tether_learner_staleness_bound)"
    assert "== 2)" in rules()[1]["expr"] and "== 3)" not in rules()[1]["expr"]
    assert observability.main(["--run", str(run), "--max-staleness", "3"]) == 0
    assert rules()[0]["expr"] == "vector(3)"  # said on the command line: it wins
    with pytest.raises(SystemExit):
        observability.main(["--run", str(run), "--max-staleness", "often"])
    assert 'an integer or "auto"' in capsys.readouterr().err


def test_cli_defaults_to_the_launchers_replica_count(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics_ports.json").write_text(json.dumps(PORTS))
    assert observability.main(["--run", str(run)]) == 0
    config = yaml.safe_load((run / "prometheus" / "prometheus.yml").read_text())
    targets = config["scrape_configs"][1]["static_configs"]
    assert len(targets) == observability.default_actor_replicas()


def test_cli_without_a_run_says_so(tmp_path, capsys):
    assert observability.main(["--run", str(tmp_path / "nothing")]) == 2
    assert "make run" in capsys.readouterr().err


def test_scrape_config_of_a_run_on_several_hosts():
    """The Ray driver's metrics_ports.json: host:port per process."""
    targets = {
        "learner": ["10.0.1.1:9300"],
        "actor": ["10.0.1.2:9500", "10.0.1.2:9501", "10.0.1.3:9500"],
        "envserver": ["10.0.2.1:9400", "10.0.2.2:9400"],
    }
    config = observability.scrape_config({"targets": targets, "actor_replicas": 3})
    jobs = {c["job_name"]: c["static_configs"] for c in config["scrape_configs"]}
    assert jobs["learner"] == [{"targets": ["10.0.1.1:9300"]}]
    assert jobs["actor"][2] == {"targets": ["10.0.1.3:9500"], "labels": {"replica": "2"}}
    assert [c["targets"][0] for c in jobs["envserver"]] == targets["envserver"]
    with pytest.raises(ValueError, match="envserver must be a list of host:port"):
        observability.scrape_config({"targets": {**targets, "envserver": [9400]}})
