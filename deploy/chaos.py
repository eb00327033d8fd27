"""Run the real launcher (`python -m deploy.local`) and hurt it: SIGKILL or SIGSTOP one of its
processes at a given training step or time, then wait for the run to finish. The fault
suite (tests/faults/) and `make soak` (deploy/soak.py) are both built on it.

    ChaosRun(runs_dir, args, faults=[Fault("nats-server", after_step=1)]).run()
        launcher ─► nats-server, envserver, learner, actor ─► replicas ─► vLLM engines
        when a fault is due: resolve its target's pids (processes.json + /proc), signal
        them, note the time; at the end: exit code, step times, the run directory

The roles' pids come from the supervisor's `processes.json`; replicas and their engines are
found below the actor process in /proc (deploy/proctree.py). Times count from the first
training step: engine start-up (30-130 s on a shared 2-core machine, and the same with or
without a fault) would otherwise drown what a fault costs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.supervision import read_events
from deploy import proctree
from deploy.supervisor import PIDS_FILE

REPO = Path(__file__).resolve().parent.parent
TARGETS = ("nats-server", "envserver", "learner", "actor", "replica", "engine")


@dataclass(frozen=True)
class Fault:
    target: str
    """`nats-server`, `envserver`, `learner`, `actor` (a role's process), `replica` (one
    actor replica process), or `engine` (one replica's vLLM engine processes)."""
    after_step: int | None = None
    """Strike once the learner has reported this training step..."""
    at_s: float | None = None
    """... or this many seconds after the first training step."""
    signum: int = signal.SIGKILL
    """SIGKILL, or SIGSTOP for a process that hangs (the supervisor's probe must notice)."""
    delay_s: float = 0.0
    """Wait this long after the step before striking."""


@dataclass
class Outcome:
    code: int
    run_dir: Path
    output: str
    first_step_at: float
    """Monotonic time the first train record appeared."""
    finished_at: float
    struck: list[tuple[Fault, list[int], float]] = field(default_factory=list)
    """(fault, pids signalled, monotonic time) per fault."""
    struck_wall: list[float] = field(default_factory=list)
    """time.time() of each fault (to compare with the supervisor's records)."""
    step_times: dict[int, float] = field(default_factory=dict)
    """Monotonic time each step's train record was first seen."""
    missed: list[Fault] = field(default_factory=list)
    """Faults that never became due (the run ended first)."""

    @property
    def run_s(self) -> float:
        """From the first training step to the launcher's exit."""
        return self.finished_at - self.first_step_at

    def next_step_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first train record seen after it."""
        later = [t for t in self.step_times.values() if t > moment]
        return min(later) - moment if later else None


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("kind") == "train":
            steps.append(record["step"])
    return steps


def replica_pids(run_dir: Path, table: dict | None = None) -> list[int]:
    """The actor's replica processes now, oldest pid first."""
    actor = json.loads((run_dir / PIDS_FILE).read_text()).get("actor")
    if actor is None:
        return []
    table = proctree.processes() if table is None else table
    return sorted(p.pid for p in table.values() if p.ppid == actor and "spawn_main" in p.command)


def target_pids(run_dir: Path, target: str, rng: random.Random | None = None) -> list[int]:
    """The pids to signal for `target` in the run now (empty if it is not running): one
    replica (the oldest, or a random one with `rng`) for `replica` and `engine`."""
    pids = json.loads((run_dir / PIDS_FILE).read_text())
    if target in pids:
        return [pids[target]] if pids[target] else []
    table = proctree.processes()
    replicas = replica_pids(run_dir, table)
    if not replicas:
        return []
    replica = rng.choice(replicas) if rng else replicas[0]
    if target == "replica":
        return [replica]
    assert target == "engine", target
    return [p.pid for p in proctree.descendants(replica, table) if p.command.startswith("VLLM")]


@dataclass
class ChaosRun:
    runs_dir: Path
    args: list[str]
    """deploy.local's arguments (besides local.runs_dir)."""
    faults: list[Fault] = field(default_factory=list)
    timeout_s: float = 900.0
    on_tick: Callable[[Path], None] | None = None
    """Called with the run directory about every 0.2 s while the run goes on."""
    rng: random.Random | None = None
    """Picks which replica a `replica`/`engine` fault strikes (default: the oldest)."""
    config: Path | None = None
    """deploy.local's --config (default: configs/demo.toml)."""

    def run(self) -> Outcome:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        before = {p.name for p in self.runs_dir.iterdir()}
        launcher = subprocess.Popen(
            [
                *(sys.executable, "-m", "deploy.local"),
                *(["--config", str(self.config)] if self.config else []),
                f"local.runs_dir={self.runs_dir}",
                *self.args,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"},
        )
        try:
            return self._follow(launcher, before)
        finally:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGINT)
                launcher.wait(120)

    def _follow(self, launcher: subprocess.Popen, before: set[str]) -> Outcome:
        deadline = time.monotonic() + self.timeout_s
        run_dir, pending, struck, step_times = None, list(self.faults), [], {}
        struck_wall: list[float] = []
        while launcher.poll() is None:
            assert time.monotonic() < deadline, f"the run did not finish in {self.timeout_s}s"
            time.sleep(0.2)
            if run_dir is None:
                new = [p for p in self.runs_dir.iterdir() if p.is_dir() and p.name not in before]
                run_dir = new[0] if new else None
                continue
            for step in _train_steps(run_dir):
                step_times.setdefault(step, time.monotonic())
            if self.on_tick is not None:
                self.on_tick(run_dir)
            for fault in [f for f in pending if _due(f, step_times)]:
                pids = target_pids(run_dir, fault.target, self.rng)
                for pid in pids:
                    os.kill(pid, fault.signum)
                struck.append((fault, pids, time.monotonic()))
                struck_wall.append(time.time())
                pending.remove(fault)
        finished_at = time.monotonic()
        output = launcher.stdout.read()
        assert run_dir is not None, output[-3000:]
        return Outcome(
            code=launcher.returncode,
            run_dir=run_dir,
            output=output,
            first_step_at=min(step_times.values(), default=finished_at),
            finished_at=finished_at,
            struck=struck,
            struck_wall=struck_wall,
            step_times=step_times,
            missed=pending,
        )


def _due(fault: Fault, step_times: dict[int, float]) -> bool:
    if fault.after_step is not None:
        seen = step_times.get(fault.after_step)
    else:
        seen = min(step_times.values()) + fault.at_s if step_times else None
    return seen is not None and time.monotonic() >= seen + fault.delay_s


def restarted_within(run_dir: Path, pids: list[int], since: float) -> float | None:
    """Seconds from `since` (time.time()) to the next start of the role whose process
    `pids[0]` was (a launcher's role or an actor's replica)."""
    events = read_events(run_dir)
    role = next((e["role"] for e in events if e["event"] == "started" and e["pid"] in pids), None)
    for event in events:
        if event["role"] == role and event["event"] == "started" and event["time"] > since:
            return event["time"] - since
    return None


def restarted_roles(run_dir: Path) -> list[str]:
    """Roles a supervisor restarted (the launcher's, or the actor's of a replica), in order."""
    return [e["role"] for e in read_events(run_dir) if e["event"] == "started" and e["restart"]]


def role_sessions(run_dir: Path) -> dict[int, str]:
    """The session of every process the launcher started, and its role: each leads one (a
    replica's processes are in its actor's session, and are not listed apart)."""
    return {
        e["pid"]: e["role"]
        for e in read_events(run_dir)
        if e["event"] == "started" and "/" not in e["role"]
    }


def leftovers(run_dir: Path) -> list[str]:
    """Processes still alive in any session a role of the run led (its engines included)."""
    sessions = role_sessions(run_dir)
    table = proctree.processes()
    return [
        f"{p.pid}: {p.command[:120]}"
        for sid in sessions
        for p in proctree.in_session(sid, table)
        if p.command  # zombies are gone already
    ]
