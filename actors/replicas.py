"""Launching actor replicas behind one small interface, so placement can change (local
processes now, Ray actors on a cluster later) without touching the actor loop.

    launcher.start(spec) -> handle        handle.alive / exitcode / terminate() / kill() / join()

`LocalProcesses` runs each replica in its own spawned process (vLLM needs a fresh
interpreter, and a crash takes one replica, not all) and process group, so that a replica
killed outright does not leave its vLLM engine behind: the engine does not notice its
client's death and would keep its memory for ever. `supervise` keeps N replicas running: a
replica that exits with an error is cleaned up and restarted after a backoff, within a
restart budget, and its starts and exits are events in the run's events file (the decisions
and the format are common/supervision.py's, as for every supervisor); SIGTERM is passed on
to every replica, which drains its running groups and exits.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.procs import die_with_parent
from common.supervision import (
    EXIT_GAVE_UP,
    FINAL_EXIT_CODES,
    ROLE_ENV,
    Events,
    RestartPolicy,
    Supervised,
)

log = logging.getLogger(__name__)

DEFAULT_TARGET = "actors.replica:replica_main"


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica process needs to start (picklable: it crosses a process
    boundary, and on Ray would be the actor's constructor argument)."""

    index: int
    config_path: str | None
    overrides: tuple[str, ...] = ()
    target: str = DEFAULT_TARGET
    """`module:function` run in the replica process with this spec."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form arguments for the target (tests pass fake engine scripts here)."""
    cuda_visible_devices: str | None = None
    """The GPUs of this replica's engine (set in the replica process before anything
    imports torch); None leaves the environment as it is (CPU machines)."""


class ReplicaHandle(Protocol):
    spec: ReplicaSpec

    @property
    def pid(self) -> int | None: ...

    @property
    def alive(self) -> bool: ...

    @property
    def exitcode(self) -> int | None: ...

    def terminate(self) -> None:
        """Ask for a graceful stop (the replica drains its groups)."""

    def kill(self) -> None:
        """Stop at once (no drain; its tasks come back after the broker's ack wait)."""

    def join(self, timeout_s: float | None = None) -> None: ...

    def clear_leftovers(self) -> int:
        """After the replica exited: stop what it left running (its engine processes).
        Returns how many processes were signalled."""


class ReplicaLauncher(Protocol):
    def start(self, spec: ReplicaSpec) -> ReplicaHandle: ...


def resolve(target: str) -> Callable[[ReplicaSpec], None]:
    module, sep, name = target.partition(":")
    if not sep:
        raise ValueError(f"replica target {target!r} must look like module:function")
    return getattr(importlib.import_module(module), name)


def replica_gpus(
    configured: list[str] | None, num_replicas: int, gpus_per_engine: int, visible: list[str]
) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each replica: the configured list (a launcher's placement
    plan), else a plan of our own over the `visible` GPUs; None for each on a machine
    without GPUs. ValueError (naming the counts) when the GPUs are too few."""
    if configured:
        return [configured[i % len(configured)] for i in range(num_replicas)]
    if not visible:
        return [None] * num_replicas
    from common.placement import PlacementRequest, plan_placement

    placement = plan_placement(
        {"this machine": visible},
        PlacementRequest(0, num_replicas, gpus_per_engine, colocate="never"),
    )
    return [engine.cuda_visible_devices for engine in placement.engines]


def replica_metrics_port(metrics_port: int, index: int) -> tuple[int, str]:
    """Replica `index`'s /metrics port (`actor.metrics_port` + index; 0 stays 0: a free one)
    and the setting that chose it, as messages name it."""
    setting = "actor.metrics_port" + (f" (+{index} for replica {index})" if index else "")
    return (metrics_port + index if metrics_port else 0), setting


def _process_main(spec: ReplicaSpec) -> None:
    os.setpgid(0, 0)  # a group of its own: the replica and the engine it starts
    die_with_parent()  # the supervisor killed outright: drain and stop
    if spec.cuda_visible_devices is not None:
        # Before the target imports torch or vLLM: CUDA reads these once, at its start.
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    try:
        resolve(spec.target)(spec)
        code = 0
    except SystemExit as e:  # a replica that cannot start: its line is already on stderr
        code = e.code if isinstance(e.code, int) else 1
    # Skip the interpreter's teardown: ~2 s of torch's and vLLM's static destructors, out of
    # the 5 s a SIGTERMed replica has. What matters is done by now: trajectories published,
    # tasks given back, the broker connection and the engine closed; logs are flushed here,
    # and multiprocessing's finalizers run (semaphores unregistered: the resource tracker
    # would otherwise warn of a leak).
    multiprocessing.util._run_finalizers()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_LEAK_NOTICE = "ignore:resource_tracker:UserWarning"


class LocalProcess:
    """A replica in a local spawned process."""

    def __init__(self, spec: ReplicaSpec, process: multiprocessing.process.BaseProcess) -> None:
        self.spec = spec
        self.process = process

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()  # SIGTERM: the replica's handler drains and exits

    def kill(self) -> None:
        self.process.kill()

    def join(self, timeout_s: float | None = None) -> None:
        self.process.join(timeout_s)

    def clear_leftovers(self) -> int:
        # The group outlives its leader while members (the engine) live, so its id cannot
        # have been reused by an unrelated process.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return 0  # nothing left
        return 1


class LocalProcesses:
    """ReplicaLauncher for one machine. Spawned (not forked): no inherited event loop,
    threads or CUDA state; non-daemonic, because vLLM starts its own engine process."""

    def __init__(self) -> None:
        self.context = multiprocessing.get_context("spawn")
        # An engine core killed after its exit grace (VllmEngine.shutdown) leaves a semaphore
        # that multiprocessing's resource tracker, which the first spawn below starts with
        # this process's -W options, unlinks with a warning closing every replica's log.
        if _LEAK_NOTICE not in sys.warnoptions:
            sys.warnoptions.append(_LEAK_NOTICE)

    def start(self, spec: ReplicaSpec) -> LocalProcess:
        resolve(spec.target)  # fail here, not in the child, on a bad target
        process = self.context.Process(
            target=_process_main, args=(spec,), name=f"actor-replica-{spec.index}"
        )
        process.start()
        log.info("started replica %d (pid %d)", spec.index, process.pid)
        return LocalProcess(spec, process)


def supervise(
    launcher: ReplicaLauncher,
    specs: list[ReplicaSpec],
    *,
    should_stop: Callable[[], bool],
    policy: RestartPolicy | None = None,
    events: Events | None = None,
    role: str | None = None,
    poll_s: float = 0.5,
    stop_timeout_s: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the replicas until `should_stop()`; restart any that exits with an error (after
    the policy's backoff, so a broken config does not spin). Every start and exit is an
    event (common/supervision.py) in the run's events file, as `<role>/replica-<i>`: by
    default the file and role a launcher put in this process's environment. Returns 0;
    EXIT_GAVE_UP if a replica spent its restart budget; 1 if one had to be killed on the way
    out; a replica's own code when it is final (it cannot start as configured, or gave up
    waiting for the broker), after stopping the others."""
    replicas = _Replicas(
        launcher,
        policy or RestartPolicy(),
        events or Events.from_environment(),
        role or os.environ.get(ROLE_ENV, "actor"),
        clock,
    )
    for spec in specs:
        replicas.start(spec)
    code = 0
    while not should_stop():
        now = clock()
        for index, handle in list(replicas.handles.items()):
            if not handle.alive and index not in replicas.restart_at:
                code = replicas.on_exit(index, handle, now)
                if code:
                    break
        if code:
            break
        for index, when in list(replicas.restart_at.items()):
            if when <= now:
                del replicas.restart_at[index]
                replicas.start(replicas.handles[index].spec)
        if replicas.all_finished():
            return 0
        time.sleep(poll_s)
    return max(code, _stop(replicas.handles, stop_timeout_s))


class _Replicas:
    """`supervise`'s state: each replica's handle, its restart decisions, its events."""

    def __init__(self, launcher, policy, events: Events, role: str, clock) -> None:
        self.launcher, self.policy, self.events, self.role = launcher, policy, events, role
        self.clock = clock
        self.handles: dict[int, ReplicaHandle] = {}
        self.supervised: dict[int, Supervised] = {}
        self.restart_at: dict[int, float] = {}
        """Replicas waiting out their backoff (inf: finished, never again)."""

    def name(self, index: int) -> str:
        return f"{self.role}/replica-{index}"

    def start(self, spec: ReplicaSpec) -> None:
        handle = self.handles[spec.index] = self.launcher.start(spec)
        supervised = self.supervised.setdefault(spec.index, Supervised(self.policy))
        restart = supervised.started(self.clock())
        self.events.write(self.name(spec.index), "started", pid=handle.pid, restart=restart)

    def on_exit(self, index: int, handle: ReplicaHandle, now: float) -> int:
        """Clear what the replica left and decide; the actor's exit code when it must stop
        (a final code, or the budget spent), else 0."""
        left, code, name = handle.clear_leftovers(), handle.exitcode, self.name(index)
        if code == 0:
            log.info("replica %d exited cleanly", index)
            self.events.write(name, "finished", pid=handle.pid, code=0)
            self.restart_at[index] = float("inf")
            return 0
        verdict = self.supervised[index].exited(code, now)
        if verdict.action != "restart":
            log.error(
                "replica %d exited with %s (%s; its log lines above say why): not restarting "
                "it; stopping the actor",
                index, code, verdict.reason,
            )  # fmt: skip
            self.events.write(name, "gave_up", pid=handle.pid, code=code, reason=verdict.reason)
            return code if code in FINAL_EXIT_CODES else EXIT_GAVE_UP
        delay = verdict.restart_at - now
        log.warning(
            "replica %d exited with %s (%d leftover process groups killed); restarting in %.1fs",
            index, code, left, delay,
        )  # fmt: skip
        self.events.write(
            name, "exited", pid=handle.pid, code=code, killed_leftovers=left,
            restart_in_s=round(delay, 3),
        )  # fmt: skip
        self.restart_at[index] = verdict.restart_at
        return 0

    def all_finished(self) -> bool:
        """Every replica exited 0 on its own."""
        return len(self.restart_at) == len(self.handles) and all(
            t == float("inf") for t in self.restart_at.values()
        )


def _stop(handles: dict[int, ReplicaHandle], stop_timeout_s: float) -> int:
    """SIGTERM every live replica, wait for the drains, kill what is left. 1 if any had to
    be killed."""
    for handle in handles.values():
        if handle.alive:
            handle.terminate()
    deadline = time.monotonic() + stop_timeout_s
    code = 0
    for handle in handles.values():
        handle.join(max(deadline - time.monotonic(), 0.0))
        if handle.alive:
            log.warning(
                "replica %d did not stop in %.0fs; killing it", handle.spec.index, stop_timeout_s
            )
            handle.kill()
            handle.join()
            code = 1
        handle.clear_leftovers()
    return code
