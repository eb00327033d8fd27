"""`make cluster-up TARGET=ray` on a real Ray cluster of two simulated nodes on this machine
(loopback only), to a finished short run, with an actor replica and the learner killed on the
way; then `make cluster-down TARGET=ray`, and nothing is left: no process (by PID), no actor
and no placement group in the cluster's own state, every resource free again.

    ray.cluster_utils.Cluster
      head (127.0.0.1, 2 CPUs, {"cpu_node": 1})     nats-server, env server, the supervisor
      node (127.0.0.1, 2 CPUs, {"gpu_node": 2})     learner rank 0, actor replica 0
                                                    ("gpu_node" stands in for GPUs)
    python -m deploy.cluster up --target=ray -- <short run>    (what the Makefile runs)
      ├─ after the first training step: SIGKILL the actor replica's process
      │  -> `actor --replicas 1` restarts it, as under `make run`, with the same events
      └─ after the second: SIGKILL the learner -> the run's supervisor restarts it in its
         bundle, it resumes from its checkpoint; the run finishes with every step once
    python -m deploy.cluster down --target=ray
    then a second run, detached, is brought down while its engine starts.

One pytest process of its own (tests/suites.toml): it starts and kills process trees, and the
Ray cluster must not share a process with the actor tests' session engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from common.supervision import read_events  # noqa: E402
from deploy.ray_process import marked_pids  # noqa: E402
from deploy.ray_testbed import FITS_THE_TESTBED, local_cluster  # noqa: E402
from tests.deploy.ray_local import (  # noqa: E402
    engines,
    replica_process,
    role_process,
    train_records,
    wait_for_no_leftovers,
)
from tests.e2e.test_make_run import _command_lines  # noqa: E402
from tests.restart_events import killed_and_restarted  # noqa: E402

# A loaded 2-core machine starts a vLLM engine in minutes, not seconds: room for two.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
RUN_DEADLINE_S = 1200

REPO = Path(__file__).resolve().parents[2]
REPLICA = "actor-0/replica-0"
"""The events' name of the one replica that `actor --replicas 1` of role actor-0 runs."""
STEPS = 3
NAMESPACE = "tether-test"
SHORT_RUN = [
    "prepare.warm_start=false",  # random weights (seconds): the plumbing, not the learning
    "prepare.num_train_rows=64",
    "prepare.num_eval_rows=4",
    f"learner.total_steps={STEPS}",
    "learner.max_staleness=1",
    "learner.prompts_per_step=4",
    "learner.group_size=4",
    f"learner.eval_interval={STEPS}",
    "learner.eval_samples_per_prompt=2",
    "learner.drain_timeout_s=10",  # after the last step, a short wait for groups in flight
    "actor.rollout.max_generate_length=16",
    # A restarted replica starts from the newest snapshot (then joins the broadcasts): with
    # one replica and staleness 1, an older snapshot could never generate for the learner.
    "learner.snapshot_interval=1",
    "learner.checkpoint.interval=1",  # the learner, killed after step 2, resumes at v2
    # a killed replica's prompts come back to the restarted one soon
    "broker.prompt_ack_wait_s=15",
    "actor.heartbeat_s=3",
    # the cluster: one replica, one env server, small reservations, free loopback ports
    "ray.actor_replicas=1",
    "ray.envservers=1",
    *FITS_THE_TESTBED,
    f"ray.namespace={NAMESPACE}",
    "ray.placement_timeout_s=60",
]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as c:
        try:
            yield c
        finally:
            # A test that failed half-way: its runs go down before the cluster does.
            for runs_dir in RUNS_DIRS:
                if any(runs_dir.iterdir()):
                    subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "deploy.ray_cluster",
                            "down",
                            f"ray.namespace={NAMESPACE}",
                        ],
                        cwd=REPO,
                        env=_env(),
                        capture_output=True,
                        timeout=300,
                        check=False,
                    )
                    break


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}


RUNS_DIRS: list[Path] = []


def _cluster(action: str, *args: str, runs_dir: Path, log: Path) -> subprocess.Popen:
    """The Makefile's entry point (`make cluster-up TARGET=ray ARGS=...`), its output to `log`."""
    RUNS_DIRS.append(runs_dir)
    extra = [*SHORT_RUN, f"ray.runs_dir={runs_dir}", *args] if action == "up" else list(args)
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deploy.cluster", action, "--target=ray", "--", *extra],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
        )


def _down(runs_dir: Path) -> str:
    log = runs_dir / "down.log"
    down = _cluster("down", f"ray.namespace={NAMESPACE}", runs_dir=runs_dir, log=log)
    down.wait(timeout=300)
    output = log.read_text()
    assert down.returncode == 0, output
    return output


def _ray_state(run_id: str) -> tuple[list[str], list[str], dict, dict]:
    """The cluster's own view: the run's named actors, its placement groups not removed,
    and the cluster's total and available resources."""
    if not ray.is_initialized():
        ray.init(address=os.environ["RAY_ADDRESS"], namespace=NAMESPACE, logging_level="WARNING")
    from ray.util.placement_group import placement_group_table

    actors = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"{run_id}/")
    ]
    groups = [
        info["name"]
        for info in placement_group_table().values()
        if f"/{run_id}/" in info.get("name", "") and info.get("state") != "REMOVED"
    ]
    return actors, groups, ray.cluster_resources(), ray.available_resources()


def _assert_nothing_left_in_ray(run_id: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        actors, groups, total, available = _ray_state(run_id)
        free = {k: available.get(k, 0) for k in ("CPU", "gpu_node", "cpu_node")}
        if not actors and not groups and free == {k: total[k] for k in free}:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"left in Ray: actors {actors}, groups {groups}, free {free} of {total}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def finished_run(cluster, tmp_path_factory):
    """A whole short run with a SIGKILL of the actor replica after step 1 and of the learner
    after step 2; then `down`."""
    runs_dir = tmp_path_factory.mktemp("runs")
    before = set(_command_lines())
    started = time.monotonic()
    log = runs_dir / "up.log"
    up = _cluster("up", runs_dir=runs_dir, log=log)
    run_dir = run_id = None
    killed_at = restarted_at = ready_again_at = None
    killed_pid = learner_pid = learner_killed_at = None
    engines_seen: set[int] = set()
    deadline = time.monotonic() + RUN_DEADLINE_S
    while up.poll() is None and time.monotonic() < deadline:
        if run_dir is None and (runs_dir / "latest").exists():
            run_dir = (runs_dir / "latest").resolve()
            run_id = run_dir.name
        if run_dir is not None:
            engines_seen |= set(engines(run_id, before))
        if run_dir is not None and killed_at is None and train_records(run_dir):
            killed_pid = replica_process(run_id, "actor-0")
            if killed_pid is not None:  # mid-run: one step trained, more to go
                os.kill(killed_pid, signal.SIGKILL)
                killed_at = time.monotonic()
        if killed_at is not None and restarted_at is None:
            if any(
                e["role"] == REPLICA and e["event"] == "started" and e["restart"]
                for e in read_events(run_dir)
            ):
                restarted_at = time.monotonic()
        if restarted_at is not None and ready_again_at is None:
            pid = replica_process(run_id, "actor-0")
            if pid is not None and pid != killed_pid and _replica_ready(run_dir):
                ready_again_at = time.monotonic()
        if killed_at is not None and learner_killed_at is None:
            if len(train_records(run_dir)) >= 2:  # a checkpoint at v2, one step to go
                learner_pid = role_process(run_id, "learner-0")
                if learner_pid is not None:
                    os.kill(learner_pid, signal.SIGKILL)
                    learner_killed_at = time.monotonic()
        time.sleep(0.5)
    output = log.read_text()
    if up.poll() is None:
        up.kill()
        pytest.fail(f"the run did not finish in {RUN_DEADLINE_S} s:\n" + output[-5000:])
    finished_at = time.monotonic()
    assert up.returncode == 0, output[-5000:]
    assert killed_at is not None, "the actor replica was never killed:\n" + output[-3000:]
    assert learner_killed_at is not None, "the learner was never killed:\n" + output[-3000:]
    timings = {
        "run_s": finished_at - started,
        "restart_s": (restarted_at or float("nan")) - killed_at,
        "ready_again_s": (ready_again_at or float("nan")) - killed_at,
        "learner_kill_to_end_s": finished_at - learner_killed_at,
    }
    down_started = time.monotonic()
    down_output = _down(runs_dir)
    timings["down_s"] = time.monotonic() - down_started
    print(
        "ray run: "
        + ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
        + f"\n{output[-3000:]}\n{down_output}"
    )
    (runs_dir / "timings.json").write_text(json.dumps(timings, indent=2))
    assert engines_seen, "no vLLM engine process carried the run's marker"
    killed = {"replica": killed_pid, "learner": learner_pid}
    return run_dir, run_id, output, down_output, before, timings, killed


def _replica_ready(run_dir: Path) -> bool:
    """The restarted replica answers /readyz (engine up, weights current)."""
    import urllib.request

    state = json.loads((run_dir / "ray_run.json").read_text())
    port = state["ports"]["actor-0"]["actor_metrics"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def test_the_run_finishes_with_every_step(finished_run):
    run_dir, _, output, *_ = finished_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert [r["version"] for r in train_records(run_dir)] == list(range(1, STEPS + 1))
    assert f"step   {STEPS}/{STEPS}" in output  # the progress view
    assert "eval pass@1 at end" in output  # the summary table
    assert (run_dir / "progress.png").stat().st_size > 10_000
    for name in ("nats", "envserver-0", "learner-0", "actor-0"):
        assert (run_dir / "logs" / f"{name}.log").stat().st_size > 0, name


def test_the_plan_put_each_role_on_its_kind_of_node(finished_run):
    run_dir, *_ = finished_run
    state = json.loads((run_dir / "ray_run.json").read_text())
    plan = state["plan"]
    head = plan["nats"]["node_id"]
    assert plan["envservers"][0]["node_id"] == head  # the CPU node
    assert plan["learner"][0]["node_id"] == plan["actors"][0]["node_id"] != head
    assert plan["actors"][0]["bundle"] == {"CPU": 1.0, "gpu_node": 1.0}
    started = {e["role"] for e in read_events(run_dir) if e["event"] == "started"}
    assert started == {"nats", "envserver-0", "learner", "actor-0", REPLICA}


def test_the_killed_replica_was_restarted_with_the_events_of_any_launcher(finished_run):
    """The same reading as for a replica killed under `make run` (tests/faults)."""
    run_dir, _, output, _, _, _, killed = finished_run
    run_events = read_events(run_dir)
    assert killed_and_restarted(run_events, REPLICA) == (killed["replica"], -signal.SIGKILL)
    assert f"supervisor: {REPLICA} restarted (pid" in output
    # The replica's supervisor restarted it; nothing above it did.
    assert [e["restart"] for e in run_events if e["role"] == "actor-0"] == [0]


def test_the_killed_learner_was_restarted_whole_and_resumed(finished_run):
    run_dir, _, output, _, _, _, killed = finished_run
    run_events = read_events(run_dir)
    assert killed_and_restarted(run_events, "learner") == (killed["learner"], -signal.SIGKILL)
    assert "supervisor: learner restarted on 127.0.0.1 (pid" in output
    assert [e["event"] for e in run_events if e["role"] == "learner"][-1] == "finished"
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert log.count("==== ") == 2  # two starts, one log
    # metrics.jsonl was cut back to the checkpoint and continued: every step once
    assert [r["version"] for r in train_records(run_dir)] == list(range(1, STEPS + 1))


def test_down_leaves_no_process_and_nothing_in_ray(finished_run):
    run_dir, run_id, _, down_output, before, *_ = finished_run
    assert f"run {run_id}: stopped; nothing left" in down_output
    assert wait_for_no_leftovers(run_dir, run_id, before) == []
    _assert_nothing_left_in_ray(run_id)


def test_down_stops_a_live_detached_run(finished_run, tmp_path):
    """A second run, detached; `down` while its engine starts stops every process."""
    before = set(_command_lines())
    up = _cluster("up", "--detach", runs_dir=tmp_path, log=tmp_path / "up.log")
    up.wait(timeout=300)
    output = (tmp_path / "up.log").read_text()
    assert up.returncode == 0, output
    assert "detached" in output
    run_dir = (tmp_path / "latest").resolve()
    run_id = run_dir.name
    deadline = time.monotonic() + 60
    while role_process(run_id, "actor-0") is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert role_process(run_id, "actor-0") is not None
    assert marked_pids(f"{run_id}/learner-0")
    time.sleep(3)
    down_output = _down(tmp_path)
    assert f"run {run_id}: stopped; nothing left" in down_output
    assert wait_for_no_leftovers(run_dir, run_id, before) == []
    _assert_nothing_left_in_ray(run_id)
