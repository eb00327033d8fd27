"""Launching actor replicas behind one small interface, so placement can change (local
processes now, Ray actors on a cluster later) without touching the actor loop.

    launcher.start(spec) -> handle        handle.alive / exitcode / terminate() / kill() / join()

`LocalProcesses` runs each replica in its own spawned process (vLLM needs a fresh
interpreter, and a crash takes one replica, not all) and process group, so that a replica
killed outright does not leave its vLLM engine behind: the engine does not notice its
client's death and would keep its memory for ever. `supervise` keeps N replicas running: a
replica that exits with an error is cleaned up and restarted after a backoff, within a
restart budget (`common.restarts`); SIGTERM is passed on to every replica, which drains its
running groups and exits.
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
from common.restarts import FINAL_EXIT_CODES, RestartPolicy, RestartTracker

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
    poll_s: float = 0.5,
    stop_timeout_s: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the replicas until `should_stop()`; restart any that exits with an error (after
    the policy's backoff, so a broken config does not spin). Returns 0; 1 if a replica spent
    its restart budget or had to be killed on the way out; a replica's own code when it is
    final (common/restarts.py FINAL_EXIT_CODES: it cannot start as configured, or gave up
    waiting for the broker), after stopping the others."""
    policy = policy or RestartPolicy()
    handles = {spec.index: launcher.start(spec) for spec in specs}
    trackers = {spec.index: RestartTracker(policy) for spec in specs}
    started_at = {index: clock() for index in handles}
    restart_at: dict[int, float] = {}
    code = 0
    while not should_stop():
        now = clock()
        for index, handle in list(handles.items()):
            if handle.alive or index in restart_at:
                continue
            left = handle.clear_leftovers()
            if handle.exitcode == 0:
                log.info("replica %d exited cleanly", index)
                restart_at[index] = float("inf")
                continue
            if handle.exitcode in FINAL_EXIT_CODES:  # a restart would fail the same way
                log.error(
                    "replica %d exited with %d (%s; its line above says why): not restarting "
                    "it; stopping the actor",
                    index,
                    handle.exitcode,
                    FINAL_EXIT_CODES[handle.exitcode],
                )
                code = handle.exitcode
                break
            when = trackers[index].on_exit(started_at=started_at[index], exited_at=now)
            if when is None:
                log.error("replica %d exited with %s; restart budget spent", index, handle.exitcode)
                code = 1
                break
            log.warning(
                "replica %d exited with %s (%d leftover process groups killed); restarting in "
                "%.1fs",
                index,
                handle.exitcode,
                left,
                when - now,
            )
            restart_at[index] = when
        if code:
            break
        for index, when in list(restart_at.items()):
            if when <= now:
                del restart_at[index]
                handles[index] = launcher.start(handles[index].spec)
                started_at[index] = clock()
        if len(restart_at) == len(handles) and all(t == float("inf") for t in restart_at.values()):
            return 0  # every replica finished on its own
        time.sleep(poll_s)
    return max(code, _stop(handles, stop_timeout_s))


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
