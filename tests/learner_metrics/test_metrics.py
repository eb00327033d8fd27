import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from learner import metrics as learner_metrics


def _value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _exposed() -> dict[tuple[str, tuple], float]:
    """What a scrape of /metrics returns, parsed back: (sample name, labels) -> value."""
    text = generate_latest(REGISTRY).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


STEP = {
    "kind": "train",
    "version": 7,
    "train/loss": -0.5,
    "train/grad_norm": 2.0,
    "reward_mean": 0.625,
    "tokens_per_s": 1234.0,
    "staleness": [0, 1, 1, 9],
    "version_span": [0, 0, 2, 3],
    "wait_data_s": 0.2,
    "train_s": 3.0,
    "broadcast_s": 0.04,
}


def test_record_step_updates_gauges_and_histograms():
    before = {
        "staleness_count": _value("tether_learner_staleness_count"),
        "staleness_le1": _value("tether_learner_staleness_bucket", le="1.0"),
        "staleness_le8": _value("tether_learner_staleness_bucket", le="8.0"),
        "staleness_sum": _value("tether_learner_staleness_sum"),
        "span_count": _value("tether_learner_version_span_count"),
        "span_le1": _value("tether_learner_version_span_bucket", le="1.0"),
        "wait_count": _value("tether_learner_data_wait_seconds_count"),
        "step_sum": _value("tether_learner_step_seconds_sum"),
        "broadcast_le005": _value("tether_learner_broadcast_seconds_bucket", le="0.05"),
    }
    learner_metrics.record_step(STEP)
    exposed = _exposed()
    assert exposed[("tether_learner_policy_version", ())] == 7
    assert exposed[("tether_learner_loss", ())] == -0.5
    assert exposed[("tether_learner_grad_norm", ())] == 2.0
    assert exposed[("tether_learner_reward_mean", ())] == 0.625
    assert exposed[("tether_learner_tokens_per_second", ())] == 1234.0
    assert _value("tether_learner_staleness_count") - before["staleness_count"] == 4
    assert _value("tether_learner_staleness_bucket", le="1.0") - before["staleness_le1"] == 3
    # 9 versions behind is past the last bucket (8): only +Inf holds it.
    assert _value("tether_learner_staleness_bucket", le="8.0") - before["staleness_le8"] == 3
    assert _value("tether_learner_staleness_sum") - before["staleness_sum"] == 11
    assert _value("tether_learner_version_span_count") - before["span_count"] == 4
    assert _value("tether_learner_version_span_bucket", le="1.0") - before["span_le1"] == 2
    assert _value("tether_learner_data_wait_seconds_count") - before["wait_count"] == 1
    assert _value("tether_learner_step_seconds_sum") - before["step_sum"] == pytest.approx(3.0)
    assert (
        _value("tether_learner_broadcast_seconds_bucket", le="0.05") - before["broadcast_le005"]
        == 1
    )
    buckets = [
        dict(labels)["le"]
        for (name, labels) in exposed
        if name == "tether_learner_staleness_bucket"
    ]
    assert buckets == ["0.0", "1.0", "2.0", "3.0", "4.0", "5.0", "6.0", "7.0", "8.0", "+Inf"]


def test_counters_advance_by_the_change_of_cumulative_totals():
    trained = _value("tether_learner_trained_trajectories_total")
    stale = _value("tether_learner_dropped_trajectories_total", reason="stale")
    errors = _value("tether_learner_dropped_trajectories_total", reason="errors")
    learner_metrics._last_totals.clear()  # a fresh process
    learner_metrics.record_step({"trained": 64, "dropped_by_reason": {"stale": 8}})
    learner_metrics.record_step({"trained": 128, "dropped_by_reason": {"stale": 8, "errors": 3}})
    learner_metrics.record_step({"version": 3})  # no counts: counters stay
    assert _value("tether_learner_trained_trajectories_total") - trained == 128
    assert _value("tether_learner_dropped_trajectories_total", reason="stale") - stale == 8
    assert _value("tether_learner_dropped_trajectories_total", reason="errors") - errors == 3
    learner_metrics.record_step({"trained": 10})  # a new run in this process: new baseline
    learner_metrics.record_step({"trained": 15})
    assert _value("tether_learner_trained_trajectories_total") - trained == 133
    exposed = _exposed()
    assert ("tether_learner_dropped_trajectories_total", (("reason", "stale"),)) in exposed


def test_eval_pass_at_1_per_environment():
    learner_metrics.record_step(
        {
            "kind": "eval",
            "eval/all/pass_at_1": 0.5,
            "eval/env/calculator/pass_at_1": 0.75,
            "eval/env/calculator/pass_at_n": 1.0,
        }
    )
    assert _value("tether_learner_eval_pass_at_1", env="all") == 0.5
    assert _value("tether_learner_eval_pass_at_1", env="calculator") == 0.75


def test_metrics_endpoint_serves_them():
    import urllib.request

    import prometheus_client

    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1")
    try:
        learner_metrics.record_step({"version": 11})
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert "tether_learner_policy_version 11.0" in text.splitlines()
