"""The pure parts of the system benchmarks (bench/async.py, peer_trl.py, staleness.py,
weightsync.py): the arithmetic that turns records into the published figures, checked on
numbers worked out by hand. Nothing here runs a benchmark or asserts a speed."""

from __future__ import annotations

import json
import math

import pytest

from bench import async_support, peer_breakdown, peer_trl, peer_trl_worker, tether_run, weightsync
from bench.tether_run import RunRecord

BUSY = "tether_actor_engine_busy_seconds_total"
TOKENS = "tether_actor_generated_tokens_total"

METRICS_PAGE = """# HELP tether_actor_engine_busy_seconds_total Wall time ...
# TYPE tether_actor_engine_busy_seconds_total counter
tether_actor_engine_busy_seconds_total 12.5
tether_actor_generated_tokens_total 3000.0
tether_actor_wait_seconds_total{what="prompts"} 1.5
tether_actor_wait_seconds_total{what="weights"} 0.25
tether_actor_weight_update_stall_seconds_sum{kind="broadcast"} 9.0
tether_actor_weight_update_stall_seconds_sum{kind="snapshot"} 4.0
"""


def test_prometheus_counters_are_read_by_exact_series():
    values = tether_run.parse_counters(METRICS_PAGE)
    assert values == {
        BUSY: 12.5,
        TOKENS: 3000.0,
        'tether_actor_wait_seconds_total{what="prompts"}': 1.5,
        'tether_actor_wait_seconds_total{what="weights"}': 0.25,
        'tether_actor_weight_update_stall_seconds_sum{kind="broadcast"}': 9.0,
    }  # the snapshot series is not asked for


def _run(*, intervals, waits, trains, broadcasts, busy, tokens=None, replicas=2) -> RunRecord:
    """A watched run: train records at learner-clock times given by `intervals` (the first
    step ends at 10 s), seen 0.5 s later on the watcher's clock; actor samples whose summed
    busy counter at each record is `busy[i]`."""
    run = RunRecord(run_dir=None)
    wall = 10.0
    for i, (interval, wait, train, broadcast) in enumerate(
        zip([0.0, *intervals], waits, trains, broadcasts, strict=True)
    ):
        wall += interval
        run.records.append(
            {
                "kind": "train",
                "version": i + 1,
                "wall_s": wall,
                "t": wall + 0.5,
                "wait_data_s": wait,
                "train_s": train,
                "broadcast_s": broadcast,
                "num_tokens": 1000,
                "max_staleness_seen": 1,
            }
        )
        per_replica = [
            {BUSY: busy[i] / replicas, TOKENS: (tokens or [0] * len(busy))[i] / replicas}
        ] * replicas
        run.actor_samples.append((wall + 0.5, per_replica))
    return run


def test_tether_breakdown_of_steady_steps():
    # Steps end at 10, 14, 18, 24 s: steady intervals 4, 4, 6 (step 1 waits for the engines).
    run = _run(
        intervals=[4, 4, 6],
        waits=[9.0, 1.0, 0.0, 2.0],
        trains=[1.0, 2.5, 3.0, 3.5],
        broadcasts=[0.1, 0.2, 0.2, 0.2],
        busy=[5.0, 9.0, 15.0, 21.0],
    )
    run.records.append({"kind": "eval", "version": 2, "wall_s": 17.0, "t": 17.5, "pass_at_1": 0.5})
    run.wall_s = 40.0
    figures = peer_breakdown.tether_breakdown(run)
    assert figures["tether_per_step_s"] == pytest.approx(14 / 3)
    assert figures["tether_wait_data_per_step_s"] == pytest.approx(1.0)
    assert figures["tether_train_per_step_s"] == pytest.approx(3.0)
    assert figures["tether_broadcast_per_step_s"] == pytest.approx(0.2)
    assert figures["tether_other_per_step_s"] == pytest.approx(14 / 3 - 4.2)
    assert figures["tether_learner_wait_frac"] == pytest.approx(3 / 14)
    assert figures["tether_startup_s"] == pytest.approx(10.5 - 4)  # seen at 10.5, minus a step
    # 16 busy seconds over 2 replicas and 14 s: 8/14 of the time each engine generated
    assert figures["tether_engine_busy_frac"] == pytest.approx(16 / 2 / 14)
    assert figures["tether_engine_busy_per_step_s"] == pytest.approx(8 / 3)
    assert figures["tether_eval_s"] == pytest.approx(17.0 - 14.0)


def test_trl_breakdown_leaves_the_first_step_out():
    records = [
        {"kind": "start", "t": 0.5},
        {"kind": "step", "step": 1, "step_s": 9.0, "generate_s": 6.0, "t": 30.0},
        {"kind": "step", "step": 2, "step_s": 3.0, "generate_s": 2.0, "t": 33.0},
        {"kind": "step", "step": 3, "step_s": 2.0, "generate_s": 1.0, "t": 35.0},
    ]
    figures = peer_breakdown.trl_breakdown({"records": records, "wall_s": 40.0})
    assert figures["trl_per_step_s"] == 2.5
    assert figures["trl_generate_per_step_s"] == 1.5
    assert figures["trl_train_per_step_s"] == 1.0
    assert figures["trl_startup_s"] == 21.0


def test_time_to_target_is_the_first_checkpoint_at_or_above_it():
    points = [(30.0, 0.81), (0.0, 0.4), (10.0, 0.7), (20.0, 0.8), (40.0, 0.9)]
    assert peer_trl.time_to_target(points, 0.8) == 20.0
    assert peer_trl.time_to_target(points, 0.95) is None


def test_the_watcher_keeps_each_snapshot_the_learner_writes_once(tmp_path):
    import torch

    from weights.formats.snapshot import safetensors_weights, write_snapshot

    run = RunRecord(run_dir=tmp_path / "run")
    watcher = tether_run._Watcher(run, started=0.0, keep_dir=tmp_path / "kept")
    watcher.poll()  # nothing written yet
    write_snapshot(run.run_dir / "weights", 5, [("w", torch.ones(2))])
    watcher.poll()
    watcher.poll()
    [(version, written, kept)] = run.snapshots
    [shard] = (run.run_dir / "weights" / "v000005").glob("*.safetensors")
    assert version == 5 and written == shard.stat().st_mtime  # started at 0.0
    assert [name for name, _ in safetensors_weights(kept)] == ["w"]


def test_the_watcher_takes_a_replicas_page_only(tmp_path):
    """A port that answers without the actor's series (a replica exiting, or another
    process on its port) is no sample: a ladder run once ended on one and lost its row."""
    import http.server
    import threading

    pages = [b"# another process\nprocess_cpu_seconds_total 1.0\n", METRICS_PAGE.encode()]

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(pages[0])

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = RunRecord(run_dir=tmp_path)
        (tmp_path / "metrics_ports.json").write_text(
            json.dumps({"actor": server.server_port, "actor_replicas": 1})
        )
        watcher = tether_run._Watcher(run, started=0.0, keep_dir=None)
        watcher.poll()
        assert run.actor_samples == []
        pages.pop(0)
        watcher.poll()
        [(_, [sample])] = run.actor_samples
        assert sample[TOKENS] == 3000.0
    finally:
        server.shutdown()


def test_peer_curves_share_the_start_and_name_every_checkpoint():
    scores = {"start": 0.4, "trl_2": 0.6, "trl_4": 0.85, "tether_2": 0.7}
    trl = {"checkpoints": [(2, 11.0, "a"), (4, 15.0, "b")]}
    tether = RunRecord(run_dir=None, snapshots=[(2, 40.0, "c")])
    curves = peer_trl.curves(scores, trl, tether)
    assert curves["trl"] == [(0, 0.0, 0.4), (2, 11.0, 0.6), (4, 15.0, 0.85)]
    assert curves["tether"] == [(0, 0.0, 0.4), (2, 40.0, 0.7)]


def test_the_trl_reward_is_the_calculator_envs_answer_rule():
    spec = json.dumps({"method": "rule", "ground_truth": "813"})
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 694, "b": 119}}}
    right = [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": "813"},
        {"role": "assistant", "content": "<answer>813</answer>"},
    ]
    wrong = [{"role": "assistant", "content": "<answer>812</answer>"}]
    still_calling = [{"role": "assistant", "tool_calls": [call]}]
    no_answer = [{"role": "assistant", "content": "813"}]
    completions = [right, wrong, still_calling, no_answer]
    assert peer_trl_worker.answer_reward(completions, [spec] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert peer_trl_worker.add(694, 119) == "813"  # the calculator's own formatting


def test_async_figures_and_the_idle_arithmetic():
    run = _run(
        intervals=[2, 2, 2, 2],
        waits=[20.0, 0.5, 0.0, 0.3, 0.2],
        trains=[1.5] * 5,
        broadcasts=[0.1] * 5,
        busy=[0.0, 3.2, 6.4, 9.6, 12.8],
        tokens=[0, 1000, 2000, 3000, 4000],
    )
    figures = async_support.mode_figures(run)
    assert figures["s_per_step"] == 2.0
    assert figures["learner_idle_frac"] == pytest.approx(1.0 / 8)
    assert figures["learner_train_frac"] == pytest.approx(0.75)
    assert figures["actor_idle_frac"] == pytest.approx(1 - 12.8 / 2 / 8)  # 0.2
    assert figures["engine_busy_s_per_step"] == pytest.approx(1.6)
    assert figures["generated_tokens_per_s"] == pytest.approx(500.0)
    assert figures["trained_tokens_per_s"] == pytest.approx(500.0)


def test_the_gpu_model_takes_the_busier_device():
    sync = {
        "wait_data_s_per_step": 3.0,  # G: the whole batch, tails included
        "train_s_per_step": 1.8,
        "broadcast_s_per_step": 0.2,  # T = 2
        "engine_busy_s_per_step": 1.5,  # E
    }
    model = async_support.gpu_model(sync)
    assert model["model_gpu_sync_s_per_step"] == 5.0
    assert model["model_gpu_async_s_per_step"] == 2.0
    assert model["model_gpu_speedup"] == 2.5
    assert model["model_gpu_learner_idle_frac"] == 0.0
    assert model["model_gpu_actor_idle_frac"] == 0.25


def test_the_stall_is_the_token_gap_over_the_update():
    # tokens every 10 ms, then nothing from 0.10 to 0.25 (the update 0.12-0.24), then again
    arrivals = [i * 0.01 for i in range(11)] + [0.25, 0.26, 0.27]
    stall, step = weightsync.stall_of(arrivals, 0.12, 0.24)
    assert stall == pytest.approx(0.15)
    assert step == pytest.approx(0.01)


def test_weightsync_summary_compares_each_k_with_loopback():
    def round_(rate, stall):
        parts = {f"engine_{p}_s": 0.01 for p in ("stall", "pause", "receive", "load")}
        timing = {"bytes_per_s": rate, "transfer_s": 0.2, "stall_s": stall, "decode_step_s": 0.02}
        return timing | parts

    rounds = {1: [round_(80.0, 0.03), round_(60.0, 0.05)], 2: [round_(40.0, 0.06)] * 2}
    figures = weightsync.summarize([100.0, 120.0, 90.0], rounds, nbytes=1000)
    assert figures["loopback_bytes_per_s"] == 100.0
    assert figures["ratio_vs_loopback_k1"] == 0.7
    assert figures["ratio_vs_loopback"] == 0.4  # the smaller
    assert figures["stall_ms"] == pytest.approx(60.0)  # the larger
    assert figures["decode_step_ms"] == pytest.approx(20.0)
    assert figures["stall_in_decode_steps"] == pytest.approx(3.0)


def test_staleness_figures_report_spread_over_seeds():
    from argparse import Namespace

    from bench import staleness

    results = {(0, "none"): [0.8, 0.9], (4, "tis"): [0.6, 0.7, 0.8]}
    args = Namespace(steps=8, seeds=2, eval_rows=[{}] * 100, eval_samples=2)
    figures = staleness.figures_of(0.4, results, args, seconds=60.0)
    assert figures["pass1_k0_none_mean"] == pytest.approx(0.85)
    assert figures["pass1_k0_none_std"] == pytest.approx(0.05)
    assert (figures["pass1_k4_tis_min"], figures["pass1_k4_tis_max"]) == (0.6, 0.8)
    assert figures["trained_samples"] == 8 * 64
    assert all(isinstance(v, int | float) and not math.isnan(v) for v in figures.values())
