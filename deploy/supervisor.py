"""The launcher's supervisor: restarts what dies, the way Kubernetes or Ray would, so that
`make run` has the semantics a cluster has.

    start(service) ─► child in a session of its own, log appended to logs/<name>.log
    poll():
      exited?      ─► clear its session (grandchildren: vLLM engines, replicas), then what
                      `common.supervision.Supervised` decides: finished, given up (the run
                      fails), or restarted after the policy's backoff
      liveness?    ─► GET its /healthz; `probe_failures` misses in a row once it has answered
                      (or once its start-up ran past `startup_timeout_s`): SIGKILL (a hung
                      process is a dead one), then the exit path above
    every start, exit, kill and give-up ─► one event in the run's events.jsonl

The decisions and the event format are common/supervision.py's, shared with the actor's
supervisor of its replicas and the Ray launcher's; this module is plumbing. Each process
gets the events file and its role's name in its environment (`TETHER_EVENTS`,
`TETHER_ROLE`), so the actor's replica restarts land in the same file.
Roles restart with the same command line: the learner resumes from its newest checkpoint
(`learner.checkpoint.resume`, on by default), the broker from its file store, and every
client reconnects on its own.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.supervision import (
    EVENTS_ENV,
    EVENTS_FILE,
    ROLE_ENV,
    Events,
    RestartPolicy,
    Supervised,
)
from deploy import proctree
from deploy.processes import Child, ProcessGroup

log = logging.getLogger(__name__)

PIDS_FILE = "processes.json"


@dataclass(frozen=True)
class Service:
    """One supervised process."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    cwd: str | Path | None = None
    finishes: bool = False
    """Exit code 0 means its work is done (the learner): not restarted. Other services are
    restarted whatever their exit code, as a Deployment's pods are."""
    liveness_url: str | None = None
    """An HTTP URL that answers 200 while the process is alive (its /healthz)."""


@dataclass
class _State:
    service: Service
    supervised: Supervised
    child: Child | None = None
    restart_at: float | None = None
    answered: bool = False
    """Its probe has succeeded since the last start (probes before that are start-up)."""
    started_at: float = 0.0
    probe_failures: int = 0
    next_probe_at: float = 0.0
    done: bool = False
    gave_up: bool = False


def http_probe(url: str, timeout_s: float) -> bool:
    """True if `url` answers 200 within `timeout_s`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    # Network boundary: any failure to answer is a failed probe.
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


@dataclass
class Supervisor:
    run_dir: Path
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    probe_period_s: float = 2.0
    probe_timeout_s: float = 3.0
    probe_failures: int = 3
    """Missed probes in a row after which a process counts as hung and is killed."""
    clock: Callable[[], float] = time.monotonic
    probe: Callable[[str, float], bool] = http_probe

    def __post_init__(self) -> None:
        self.processes = ProcessGroup(self.run_dir / "logs")
        self.events = Events(self.run_dir / EVENTS_FILE)
        self._states: dict[str, _State] = {}

    # ---- starting and stopping ---------------------------------------------------------------

    def start(self, service: Service) -> Child:
        supervised = Supervised(self.policy, finishes=service.finishes)
        state = self._states.setdefault(service.name, _State(service, supervised))
        return self._spawn(state)

    def _spawn(self, state: _State) -> Child:
        service = state.service
        if state.child is not None:  # the dead one: forget it, its pid may be reused
            self.processes.children.remove(state.child)
        env = {
            **(service.env or {}),
            EVENTS_ENV: str(self.events.path),
            ROLE_ENV: service.name,
        }
        child = self.processes.start(service.name, service.argv, env=env, cwd=service.cwd)
        state.child, state.restart_at = child, None
        state.answered, state.probe_failures, state.next_probe_at = False, 0, self.clock()
        state.started_at = state.next_probe_at
        restart = state.supervised.started(self.clock())
        self.events.write(service.name, "started", pid=child.process.pid, restart=restart)
        self._write_pids()
        return child

    def stop_all(self, grace_s: float = 15.0) -> None:
        """SIGTERM every live child, SIGKILL what is left after `grace_s`, sessions included."""
        self.processes.stop_all(grace_s)

    # ---- watching ----------------------------------------------------------------------------

    def poll(self) -> None:
        """Reap exits, restart what is due, probe liveness. Call it every fraction of a second."""
        now = self.clock()
        for state in self._states.values():
            if state.done or state.gave_up:
                continue
            if state.restart_at is not None:
                if now >= state.restart_at:
                    self._spawn(state)
                continue
            code = state.child.returncode
            if code is None:
                self._check_liveness(state, now)
            else:
                self._on_exit(state, code, now)

    def _on_exit(self, state: _State, code: int, now: float) -> None:
        name, pid = state.service.name, state.child.process.pid
        left = proctree.kill_session(pid)  # its session id is its pid
        verdict = state.supervised.exited(code, now)
        if verdict.action == "finished":
            state.done = True
            self.events.write(name, "finished", pid=pid, code=code)
        elif verdict.action == "gave_up":
            state.gave_up = True
            self.events.write(name, "gave_up", pid=pid, code=code, reason=verdict.reason)
        else:
            state.restart_at = verdict.restart_at
            self.events.write(
                name,
                "exited",
                pid=pid,
                code=code,
                killed_leftovers=len(left),
                restart_in_s=round(verdict.restart_at - now, 3),
            )

    def _check_liveness(self, state: _State, now: float) -> None:
        url = state.service.liveness_url
        if url is None or now < state.next_probe_at:
            return
        state.next_probe_at = now + self.probe_period_s
        if self.probe(url, self.probe_timeout_s):
            state.answered, state.probe_failures = True, 0
            return
        if not state.answered and now - state.started_at < self.policy.startup_timeout_s:
            return  # still starting up
        state.probe_failures += 1
        if state.probe_failures >= self.probe_failures:
            pid = state.child.process.pid
            self.events.write(
                state.service.name, "unresponsive", pid=pid, missed=state.probe_failures
            )
            proctree.kill_session(pid)
            state.child.process.wait()

    # ---- what callers ask ----------------------------------------------------------------------

    def finished(self, name: str) -> bool:
        return self._states[name].done

    def given_up(self) -> Child | None:
        """A child whose restart budget is spent (the run cannot go on), if any."""
        for state in self._states.values():
            if state.gave_up:
                return state.child
        return None

    def pid(self, name: str) -> int | None:
        state = self._states.get(name)
        if state is None or state.child is None or state.child.returncode is not None:
            return None
        return state.child.process.pid

    def num_restarts(self) -> dict[str, int]:
        return {name: state.supervised.num_restarts for name, state in self._states.items()}

    # ---- records -----------------------------------------------------------------------------

    def _write_pids(self) -> None:
        pids = {name: self.pid(name) for name in self._states}
        tmp = self.run_dir / (PIDS_FILE + ".tmp")
        tmp.write_text(json.dumps(pids, indent=2) + "\n")
        tmp.replace(self.run_dir / PIDS_FILE)
