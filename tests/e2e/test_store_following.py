"""An actor outside the learner's network, as a user runs it: the real launcher with the
learner's weights log on (`learner.snapshot_deltas`), no broadcast at all, and the actor
following the store (`actor.weight_source = "store"`). Every version after the first
reaches the engine from the snapshot plus the log's deltas; with a staleness bound of one
version the run can only finish if the actor keeps up that way."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.e2e.test_make_run import REPO

STEPS = 4
OVERRIDES = [
    "local.warm_start=false",
    "local.num_train_rows=64",
    "local.num_eval_rows=4",
    "local.timeout_s=900",
    f"learner.total_steps={STEPS}",
    "learner.max_staleness=1",
    "learner.prompts_per_step=4",
    "learner.group_size=4",
    "learner.eval_samples_per_prompt=1",
    "learner.snapshot_interval=3",  # v3 is a keyframe; v1, v2 and v4 come from the log
    "learner.snapshot_deltas=true",
    "learner.broadcast_weights=false",
    "actor.weight_source=store",
    "actor.rollout.max_generate_length=16",
]


def test_an_actor_that_follows_the_store_keeps_up_with_the_learner(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "deploy.local", f"local.runs_dir={tmp_path}", *OVERRIDES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    run_dir = (tmp_path / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["max_staleness_seen"] <= 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert all(r["weights_log_bytes"] > 0 and r["broadcast_receivers"] == 0 for r in train)
    actor_log = (run_dir / "logs" / "actor.log").read_text()
    loaded = re.findall(r"loading weights v(\d+) \((log|snapshot)\)", actor_log)
    assert ("3", "snapshot") in loaded or int(loaded[-1][0]) > 3, loaded
    assert [v for v, kind in loaded if kind == "log"], loaded  # deltas replayed, not only keyframes
    assert "weight store at" not in actor_log and "registered as member" not in actor_log
