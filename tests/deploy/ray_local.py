"""What a Ray run on this machine left behind, read from /proc and its run directory: the
processes of a run (by the `TETHER_RAY_PROCESS` marker every one of them carries, vLLM's
renamed engines included), its events and training records.
Used by tests/deploy/test_ray_cluster.py (its cluster: deploy/ray_testbed.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from deploy.ray_process import MARKER, marked_pids
from tests.e2e.test_make_run import _command_lines


def train_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [r for r in (json.loads(x) for x in lines if x.strip()) if r["kind"] == "train"]


def replica_process(run_id: str, role: str) -> int | None:
    """PID of the replica process `actor --replicas 1` of `role` spawned (its engine's
    parent), not the actor process."""
    actor = role_process(run_id, role)
    for pid in marked_pids(f"{run_id}/{role}"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == actor and b"spawn_main" in cmdline:
            return pid
    return None


def role_process(run_id: str, role: str) -> int | None:
    """PID of the role's command (`actor --replicas 1`, `learner`), not its children."""
    module = {"actor": b"actors.cli", "learner": b"learner.cli"}[role.split("-")[0]]
    for pid in marked_pids(f"{run_id}/{role}"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if module in cmdline:
            return pid
    return None


def environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def engines(run_id: str, before: set[int]) -> list[int]:
    """vLLM engine processes (they rename themselves `VLLM::...`, so their command line
    names nothing) started since `before` that belong to the run: they carry its marker.
    Other vLLM engines on this machine (other jobs' runs) are not the run's."""
    needle = f"{MARKER}={run_id}/".encode()
    return [
        pid
        for pid, line in _command_lines().items()
        if pid not in before and line.startswith("VLLM") and needle in environ(pid)
    ]


def leftovers(run_dir: Path, run_id: str, before: set[int]) -> list[str]:
    """The run's processes still alive: any carrying its marker (vLLM's engines included),
    or mentioning its directory."""
    needle = f"{MARKER}={run_id}/".encode()
    return [
        f"{pid}: {line[:200]}"
        for pid, line in _command_lines().items()
        if needle in environ(pid) or str(run_dir) in line
    ]


def wait_for_no_leftovers(run_dir: Path, run_id: str, before: set[int], timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(run_dir, run_id, before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left
