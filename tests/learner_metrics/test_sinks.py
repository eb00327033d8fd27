import json
import logging
import math
import sys

import numpy as np
import pytest

from learner.sinks import MetricsSink, wandb_mode, wandb_payload, wandb_run_id

TRAIN_RECORD = {
    "kind": "train",
    "step": 1,
    "version": 1,
    "reward_mean": 0.25,
    "train/loss": -0.125,
    "staleness": [0, 1],
    "dropped_by_reason": {"stale": 3},
    "degenerate": False,
}


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_lines_are_flushed_and_appended(tmp_path):
    sink = MetricsSink(tmp_path, use_wandb=False)
    sink.log(TRAIN_RECORD)
    sink.log(
        {"kind": "eval", "version": np.int64(2), "pass_at_1": np.float32(0.5), "loss": float("nan")}
    )
    records = _lines(tmp_path / "metrics.jsonl")  # read while the sink is still open
    assert records[0] == TRAIN_RECORD
    assert records[1]["version"] == 2 and records[1]["pass_at_1"] == 0.5
    assert math.isnan(records[1]["loss"])
    sink.close()
    with MetricsSink(tmp_path, use_wandb=False) as resumed:
        resumed.log({"kind": "done", "version": 2})
    assert [r["kind"] for r in _lines(tmp_path / "metrics.jsonl")] == ["train", "eval", "done"]


def test_wandb_mode_follows_the_key():
    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    assert wandb_mode({"WANDB_MODE": ""}) == "offline"


def test_wandb_payload_keeps_numbers_only():
    assert wandb_payload(TRAIN_RECORD) == {
        "step": 1,
        "version": 1,
        "reward_mean": 0.25,
        "train/loss": -0.125,
        "dropped_by_reason/stale": 3,
        "degenerate": 0,
    }
    assert wandb_payload({"a": np.float64(1.5), "b": np.zeros(2)}) == {"a": 1.5}


def test_without_wandb_installed_the_jsonl_sink_works_alone(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with caplog.at_level(logging.WARNING, logger="learner.sinks"):
        sink = MetricsSink(tmp_path)
    assert sink.wandb_run is None
    assert [r.message for r in caplog.records] == [
        f"wandb is not installed: metrics go to {tmp_path / 'metrics.jsonl'} only"
    ]
    sink.log(TRAIN_RECORD)
    sink.close()
    assert _lines(tmp_path / "metrics.jsonl") == [TRAIN_RECORD]


class _BrokenRun:
    """A W&B run whose service died: every call raises."""

    def log(self, payload):
        raise ConnectionError("wandb service went away")

    def finish(self):
        raise ConnectionError("wandb service went away")


def test_a_failing_wandb_never_stops_training(tmp_path, caplog):
    sink = MetricsSink(tmp_path, use_wandb=False)
    sink._wandb_run = _BrokenRun()  # as if W&B had started and then broke
    with caplog.at_level(logging.WARNING, logger="learner.sinks"):
        sink.log(TRAIN_RECORD)
        sink.log({**TRAIN_RECORD, "step": 2})
    assert sink.wandb_run is None
    assert any("continuing without W&B" in r.message for r in caplog.records)
    sink.close()
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.fixture
def offline_wandb_env(tmp_path, monkeypatch):
    """W&B offline, every file of it under tmp_path: nothing may touch the network."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    return tmp_path


def test_wandb_offline_run_writes_under_run_dir(offline_wandb_env):
    pytest.importorskip("wandb")
    run_dir = offline_wandb_env / "run"
    sink = MetricsSink(run_dir, run_name="metrics-test", config={"lr": 1e-4})
    run = sink.wandb_run
    assert run is not None and run.settings.mode == "offline"
    assert run.config["lr"] == 1e-4
    sink.log({**TRAIN_RECORD, "env/calculator/pass_at_n": 0.75})
    sink.log({"kind": "eval", "version": 0, "eval/all/pass_at_1": 0.125})  # older version
    sink.log({"kind": "done", "version": 1, "trained": 64})
    assert run.summary["env/calculator/pass_at_n"] == 0.75
    assert run.summary["eval/all/pass_at_1"] == 0.125
    assert run.summary["trained"] == 64
    sink.close()
    assert sink.wandb_run is None
    [run_file] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data = run_file.read_bytes()
    assert b"env/calculator/pass_at_n" in data and b"eval/all/pass_at_1" in data
    assert len(_lines(run_dir / "metrics.jsonl")) == 3


def test_every_learner_process_of_a_run_logs_to_one_wandb_run(tmp_path):
    first = wandb_run_id(tmp_path)
    assert len(first) == 16 and wandb_run_id(tmp_path) == first  # a restart, a resumed run
    other_run = tmp_path / "other"
    other_run.mkdir()
    assert wandb_run_id(other_run) != first
