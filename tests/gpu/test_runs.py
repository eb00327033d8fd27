"""Whole runs on GPUs through the real launcher (`python -m deploy.local`, i.e. `make run`):

- one GPU: the 30-step demo with the learner and both engines co-located on GPU 0 (the
  placement plan splits its memory; weights over gloo), recording pass@1 and wall time;
- two GPUs: the learner on GPU 0 and an engine on GPU 1, weights over NCCL, a few steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import USERS_START_METHOD
from tests.gpu.conftest import REPO, need_gpus, need_vllm, record

pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.slow]


def _run(runs_dir: Path, *overrides: str, gpus: str, timeout_s: float) -> tuple[dict, str]:
    """Run deploy.local; its output goes to a log file as it comes (in TETHER_GPU_LOG_DIR
    when set: the GPU kit's run brings it back even when the call's time ends mid-run)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": str(REPO)}
    if USERS_START_METHOD is None:  # the roles as users run them: vLLM's own choice
        env.pop("VLLM_WORKER_MULTIPROC_METHOD")
    log_path = Path(os.environ.get("TETHER_GPU_LOG_DIR") or runs_dir.parent) / "deploy-local.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        returncode = subprocess.run(
            [sys.executable, "-m", "deploy.local", f"local.runs_dir={runs_dir}", *overrides],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
        ).returncode
    output = log_path.read_text()
    assert returncode == 0, output[-8000:]
    return json.loads((runs_dir / "latest" / "summary.json").read_text()), output


def test_demo_on_one_gpu_learns_to_call_the_tool(tmp_path):
    need_gpus(1)
    need_vllm()
    summary, stdout = _run(tmp_path / "runs", gpus="0", timeout_s=1800)
    assert "co-located: weights over gloo" in stdout
    assert summary["steps"] == 30
    record(
        demo_1gpu_pass1_start=summary["eval_pass1_start"],
        demo_1gpu_pass1_end=summary["eval_pass1_end"],
        demo_1gpu_wall_s=round(summary["wall_s"], 1),
        demo_1gpu_tokens_per_s=round(summary["tokens_per_s_mean"]),
    )
    assert summary["eval_pass1_end"] > summary["eval_pass1_start"]


def test_learner_on_one_gpu_and_an_engine_on_another(tmp_path):
    need_gpus(2)
    need_vllm()
    summary, stdout = _run(
        tmp_path / "runs",
        "local.actor_replicas=1",
        "learner.total_steps=5",
        "learner.eval_interval=5",
        gpus="0,1",
        timeout_s=1200,
    )
    assert "learner on GPU(s) 0, engines on [1]" in stdout and "weights over gloo" not in stdout
    assert summary["steps"] == 5 and summary["max_staleness_seen"] <= 1
    metrics = [
        json.loads(line)
        for line in (tmp_path / "runs" / "latest" / "metrics.jsonl").read_text().splitlines()
    ]
    receivers = [m.get("broadcast_receivers", 0) for m in metrics if m.get("kind") == "train"]
    assert max(receivers) == 1  # the engine on GPU 1 took the NCCL broadcast
    record(two_gpu_wall_s=round(summary["wall_s"], 1))
