"""A `make run` as the system benchmarks see it: `python -m deploy.local` (the launcher
itself, configs/demo.toml plus overrides) in a subprocess, watched from outside while it
runs. Nothing in the run is changed to be watched.

    run = watch_run(overrides, work_dir, keep_snapshots=True)

What the watcher records, every `poll_s`, on one clock that starts when the launcher is
started (`t` in seconds from launch):
- each `metrics.jsonl` record as it appears (`t` is when it was seen);
- each weight snapshot the learner writes (`<run>/weights/v<N>/`, its safetensors shards),
  hard-linked away before the learner deletes it for the next one (`t` is when its last
  shard was written);
- every actor replica's Prometheus counters (engine busy seconds, generated tokens, waits).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ACTOR_COUNTERS = (
    "tether_actor_engine_busy_seconds_total",
    "tether_actor_generated_tokens_total",
    "tether_actor_generate_seconds_total",
    'tether_actor_wait_seconds_total{what="prompts"}',
    'tether_actor_wait_seconds_total{what="weights"}',
    'tether_actor_wait_seconds_total{what="env"}',
    'tether_actor_weight_update_stall_seconds_sum{kind="broadcast"}',
    'tether_actor_weight_update_stall_seconds_count{kind="broadcast"}',
    "tether_actor_weight_wire_seconds_total",
    "tether_actor_weight_update_bytes_total",
)


@dataclass
class RunRecord:
    """What one watched run left behind, on the clock of its launch."""

    run_dir: Path
    returncode: int = -1
    wall_s: float = 0.0
    records: list[dict] = field(default_factory=list)
    """metrics.jsonl records, each with `t`: seconds from launch when it was seen."""
    snapshots: list[tuple[int, float, Path]] = field(default_factory=list)
    """(version, t written, kept copy directory)."""
    actor_samples: list[tuple[float, list[dict[str, float]]]] = field(default_factory=list)
    """(t, one dict of ACTOR_COUNTERS per replica)."""

    @property
    def train(self) -> list[dict]:
        return [r for r in self.records if r["kind"] == "train"]

    @property
    def evals(self) -> list[dict]:
        return [r for r in self.records if r["kind"] == "eval"]


def parse_counters(text: str, names=ACTOR_COUNTERS) -> dict[str, float]:
    """The named series of a Prometheus text page (exact series names, labels included)."""
    wanted = set(names)
    values = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            values[name] = float(value)
    return values


def actor_counter_at(run: RunRecord, name: str, t: float) -> float:
    """The sum over replicas of counter `name` in the last sample taken at or before `t`."""
    before = [replicas for sampled, replicas in run.actor_samples if sampled <= t]
    if not before:
        return 0.0
    return sum(r.get(name, 0.0) for r in before[-1])


class _Watcher:
    def __init__(self, run: RunRecord, started: float, keep_dir: Path | None) -> None:
        self.run, self.started, self.keep_dir = run, started, keep_dir
        self.offset = 0
        self.ports: list[int] = []

    def poll(self) -> None:
        self._metrics()
        if self.keep_dir is not None:
            self._snapshots()
        self._actors()

    def _metrics(self) -> None:
        path = self.run.run_dir / "metrics.jsonl"
        if not path.is_file():
            return
        with path.open() as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        now = time.time() - self.started
        self.run.records += [{**json.loads(line), "t": now} for line in complete.splitlines()]

    def _snapshots(self) -> None:
        # A snapshot directory appears whole (the writer renames it into place), holding
        # one or more model-NNNNN.safetensors shards.
        seen = {version for version, _, _ in self.run.snapshots}
        for directory in sorted((self.run.run_dir / "weights").glob("v[0-9]*")):
            version = int(directory.name[1:])
            if version in seen:
                continue
            kept = self.keep_dir / f"tether_v{version:04d}"
            try:
                shards = sorted(directory.glob("*.safetensors"))
                if not shards:
                    continue
                kept.mkdir(parents=True, exist_ok=True)
                for shard in shards:
                    os.link(shard, kept / shard.name)
                written = max(shard.stat().st_mtime for shard in shards) - self.started
            except FileNotFoundError:  # rotated away while being kept: an incomplete copy
                shutil.rmtree(kept, ignore_errors=True)
                continue
            self.run.snapshots.append((version, written, kept))

    def _actors(self) -> None:
        ports_file = self.run.run_dir / "metrics_ports.json"
        if not self.ports and ports_file.is_file():
            ports = json.loads(ports_file.read_text())
            self.ports = [ports["actor"] + i for i in range(ports["actor_replicas"])]
        samples = []
        for port in self.ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    samples.append(parse_counters(r.read().decode()))
            # Network boundary: a replica not serving yet (engine starting) or already gone,
            # or one that exits while answering (its page cut short).
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                return
            if "tether_actor_generated_tokens_total" not in samples[-1]:
                return  # not a replica's page: one exiting, or another process on its port
        if samples:
            self.run.actor_samples.append((time.time() - self.started, samples))


def watch_run(
    overrides: list[str],
    work_dir: Path,
    *,
    keep_snapshots: bool = False,
    poll_s: float = 0.5,
    log_name: str = "launcher.log",
    config: Path | None = None,
    repo: Path = REPO,
    on_poll: Callable[[RunRecord, subprocess.Popen, float], None] | None = None,
    pythonpath: tuple[Path, ...] = (),
) -> RunRecord:
    """Run `python -m deploy.local [--config CONFIG] local.runs_dir=<work_dir>/runs
    OVERRIDES...` (configs/demo.toml by default) to its end, watching it. The run directory
    is the newest under `<work_dir>/runs`. `repo`: the checkout whose code runs (another
    revision's worktree, with this interpreter). `on_poll(run, launcher, t)` is called
    after every poll, `t` in seconds from launch. `pythonpath`: directories of the user's
    own code (plug-ins), importable by every process of the run."""
    runs_dir = work_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    before = set(runs_dir.iterdir())
    command = [sys.executable, "-m", "deploy.local"]
    command += ["--config", str(config)] if config else []
    command += [f"local.runs_dir={runs_dir}", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (repo, *pythonpath)))}
    log = (work_dir / log_name).open("w")
    started = time.time()
    process = subprocess.Popen(command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    run = RunRecord(run_dir=Path())
    watcher = None
    try:
        while True:
            done = process.poll() is not None
            if watcher is None:
                new = [p for p in set(runs_dir.iterdir()) - before if not p.is_symlink()]
                if new:
                    run.run_dir = new[0]
                    watcher = _Watcher(run, started, work_dir if keep_snapshots else None)
            if watcher is not None:
                watcher.poll()
                if on_poll is not None:
                    on_poll(run, process, time.time() - started)
            if done:
                break
            time.sleep(poll_s)
    finally:
        if process.poll() is None:  # interrupted: stop the launcher (it stops its children)
            process.terminate()
            process.wait(timeout=60)
        log.close()
    run.returncode, run.wall_s = process.returncode, time.time() - started
    if run.returncode != 0:
        tail = (work_dir / log_name).read_text()[-3000:]
        raise RuntimeError(f"deploy.local exited with {run.returncode}:\n{tail}")
    return run
