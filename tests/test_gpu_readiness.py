"""The GPU suite cannot rot on CPU machines: every `gpu` test is collected here, and every
call it makes to an engine, learner or weight API is bound against the real signature
(tests/call_signatures.py). `make gpu-check` runs only where a GPU is lent; a TypeError
there would waste the lent minutes before testing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.call_signatures import check_calls

REPO = Path(__file__).resolve().parents[1]
GPU_TESTS = REPO / "tests" / "gpu"


def test_every_gpu_test_is_collected_without_error():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
         "-p", "no:cacheprovider", str(GPU_TESTS)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    modules = {line.split("::")[0] for line in collected}
    assert len(modules) == len(list(GPU_TESTS.glob("test_*.py"))), modules


def test_every_call_in_the_gpu_tests_fits_the_real_signature():
    conftests = [REPO / "tests" / "conftest.py", GPU_TESTS / "conftest.py"]
    assert check_calls(sorted(GPU_TESTS.glob("*.py")), conftests=conftests) == []


def test_the_check_finds_a_call_that_no_longer_fits(tmp_path):
    """The call `make gpu-check` once failed on, and two more kinds of rot."""
    module = tmp_path / "test_rotten.py"
    module.write_text(
        textwrap.dedent("""
        import asyncio
        import pytest
        from actors.config import SamplingConfig, VllmEngineConfig
        from actors.vllm_engine import VllmEngine
        from weights.learner_side.sender import WeightSender

        @pytest.fixture
        async def engine():
            engine = await VllmEngine.start(VllmEngineConfig(model="m"))
            yield engine

        async def test_rotten(engine):
            await engine.generate([1, 2], SamplingConfig(), max_tokens=24)
            await engine.update_weights_now(None)
            sender = WeightSender(None, dtype="bfloat16")
            await asyncio.to_thread(sender.broadcast, 1)
            await engine.generate([1, 2], None)  # fits
    """)
    )
    problems = check_calls([module])
    assert len(problems) == 3, problems
    assert any("VllmEngine.generate" in p and "max_tokens" in p for p in problems)
    assert any("no attribute 'update_weights_now'" in p for p in problems)
    assert any("WeightSender.broadcast" in p for p in problems)


@pytest.mark.parametrize(
    "command",
    [
        ["learner.cli", "--config", "configs/demo.toml", "learner.train_data=TRAIN",
         "learner.model_path=demo/tiny_model", "learner.eval_interval=null", "learner.device=cuda"],
        ["actors.cli", "--config", "configs/demo.toml", "--replicas", "1",
         "actor.engine.model=demo/tiny_model", "actor.engine.device=cuda"],
    ],
    ids=["learner", "actor"],
)  # fmt: skip
def test_a_gpu_config_without_a_gpu_refuses_to_start_in_one_line(command, tmp_path):
    """Not a silent CPU run that fails much later: one line naming what is missing."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    train = tmp_path / "train.jsonl"  # the command line validates it before the GPU check
    prompt, truth = [{"role": "user", "content": "1+1?"}], {"ground_truth": 2}
    row = {"data_source": "t", "env_class": "e", "prompt": prompt, "reward_spec": truth}
    train.write_text(json.dumps(row) + "\n")
    command = [f"learner.train_data={train}" if a.endswith("=TRAIN") else a for a in command]
    out = subprocess.run(
        [sys.executable, "-m", *command], capture_output=True, text=True, cwd=REPO,
        timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    role = command[0].split(".")[0].rstrip("s")
    [line] = [x for x in out.stderr.splitlines() if x.startswith(f"{role}: ")]
    assert '.device = "cuda" but torch sees no GPU' in line
    assert "CPU build" in line or "NVIDIA driver" in line, line
