"""One long-lived communicator of the weight broadcast: a stateless process group (gloo on
CPU, NCCL on GPU) of the learner's rank 0 and every engine worker of one membership, kept
across rounds until the membership changes or a round fails.

Every wait is bounded and explicit, on NCCL as on gloo:

- `broadcast` returns the collective's work; `wait(work, timeout_s)` checks
  `work.is_completed()` (woken by the work's completion on gloo, polling on NCCL) until it
  is, or aborts the communicator and raises
  `TransferTimeout` when the deadline passes. On NCCL a plain `work.wait()` only orders the
  current CUDA stream after the collective and returns at once: a dead or hung peer would
  surface nowhere but in the watchdog, which by default (TORCH_NCCL_ASYNC_ERROR_HANDLING=3)
  takes the whole process down. Our own deadline comes first, and the group is built
  without a watchdog (TORCH_NCCL_BLOCKING_WAIT=1, error handling 2: weights/shared/nccl_env.py),
  so a learner or engine outlives any peer, also the minutes after.
- `close()` first waits (bounded) for every collective it started, then aborts: after that
  synchronisation nothing is in flight, so an abort cannot cut a broadcast short, and it
  never blocks on a peer that is gone (NCCL's graceful finalize would).

The group's store keys live under `group/<id>/pg` of the learner's store, so it neither
needs nor disturbs anyone's default group. torch is imported inside functions so that
configs importing this package stay fast.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from common.environ import environ_set
from weights.shared.nccl_env import WEIGHT_GROUP_ENV
from weights.shared.rendezvous import PREFIX, is_loopback

if TYPE_CHECKING:
    import torch

WATCHDOG_GRACE_S = 60.0
"""NCCL's own timeout is ours plus this: our deadline aborts first."""


class TransferTimeout(RuntimeError):
    """A collective of the weight broadcast made no progress in time; the communicator was
    aborted (a peer died or hung)."""


def _new_backend(store, host: str, group_id: int, rank: int, world_size: int, backend: str,
                 timeout_s: float):  # fmt: skip
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"{PREFIX}/group/{group_id}/pg", store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=timeout_s)
        # Bind gloo to loopback when the store is local, so nothing leaves 127.0.0.1.
        device = (
            dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
            if is_loopback(host)
            else dist.ProcessGroupGloo.create_default_device()
        )
        options._devices = [device]
        return dist.ProcessGroupGloo(prefixed, rank, world_size, options)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s + WATCHDOG_GRACE_S)
        options.group_name = f"tether-weights-{group_id}"
        # Non-blocking communicator init: an init stuck on a dead peer stays abortable
        # (bounded by TORCH_NCCL_NONBLOCKING_TIMEOUT, which each role sets at start).
        options.config.blocking = 0
        # Read from the environment per group, in its constructor: no watchdog for this
        # group, so a failed round never reaches NCCL's process monitor (nccl_env.py).
        with environ_set(WEIGHT_GROUP_ENV):
            return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    raise ValueError(f"unknown backend {backend!r}")


def buffer_device(backend: str) -> torch.device:
    """Where the broadcast's buffers live: this process's current GPU for NCCL, CPU for
    gloo (a GPU learner or engine on gloo copies through host memory)."""
    import torch

    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


PEER_CHECK_S = 0.5
"""How often a wait asks `why_stop` (one store round trip)."""


class RoundAbandoned(RuntimeError):
    """The sender this group waits on is gone or gave the round up (`why_stop` said so); the
    communicator was aborted without waiting out the timeout."""


class WeightGroup:
    """The communicator of group `group_id` at `rank` (0: the learner). Forming it blocks
    (gloo: until every rank connected, at most `timeout_s`; NCCL: lazily, at the first
    collective). `why_stop`, when given, is asked every PEER_CHECK_S while a collective is
    unfinished; a reason it returns ends the wait at once: a receiver whose sender died
    (NCCL would wait out the timeout) or failed the round (another receiver broke it) is
    free for the next round within moments, not after its own timeout."""

    def __init__(self, store, host: str, group_id: int, rank: int, world_size: int,
                 backend: str, timeout_s: float,
                 why_stop: Callable[[], str | None] | None = None) -> None:  # fmt: skip
        self.group_id, self.rank, self.world_size = group_id, rank, world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.why_stop = why_stop
        self.device = buffer_device(backend)
        self._pending: list = []
        self.waited_s = 0.0
        """Seconds spent in `wait`, in all: on a receiver, the time its rounds' bytes were
        on the wire (it waits for each message, and does its own work between them)."""
        self._backend = _new_backend(store, host, group_id, rank, world_size, backend, timeout_s)
        self.closed = False

    def broadcast(self, tensor: torch.Tensor):
        """Start broadcasting `tensor` from rank 0 (asynchronous); returns its work."""
        assert not self.closed, "broadcast on a closed weight group"
        work = self._backend.broadcast(tensor, 0)
        self._pending.append((work, tensor))  # keep the tensor alive while in flight
        return work

    def wait(self, work, what: str, timeout_s: float | None = None) -> None:
        """Until `work` completes; on the deadline, abort the group and raise
        TransferTimeout. A failed work raises its error (RuntimeError)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        deadline, next_check = started + timeout_s, started + PEER_CHECK_S
        completed = self._completion(work)
        pause = 1e-4
        while not work.is_completed():
            now = time.monotonic()
            if now >= deadline:
                self.abort()
                raise TransferTimeout(
                    f"weight group {self.group_id}: {what} made no progress in "
                    f"{timeout_s:.0f}s (a peer died or hung); communicator aborted"
                )
            if self.why_stop is not None and now >= next_check:
                next_check = now + PEER_CHECK_S
                reason = self.why_stop()
                if reason:
                    self.abort()
                    raise RoundAbandoned(
                        f"weight group {self.group_id}: {reason} while waiting for {what}; "
                        "communicator aborted"
                    )
            if completed is not None:
                completed.wait(min(PEER_CHECK_S, max(deadline - now, 0.0)))
            else:
                time.sleep(pause)
                pause = min(pause * 2, 0.005)
        self._pending = [(w, t) for w, t in self._pending if w is not work]
        self.waited_s += time.monotonic() - started
        work.wait()  # raises a failed work's error; on NCCL orders this stream after it

    def _completion(self, work) -> threading.Event | None:
        """On gloo, an event set when `work` completes: a wait wakes at once instead of
        oversleeping each bucket by a polling backoff's step (and a receiver posts its next
        receive only after its wait). None on NCCL, whose future completes as soon as the
        collective is queued: there only `is_completed()` says it has run."""
        if self.backend != "gloo":
            return None
        completed = threading.Event()
        work.get_future().add_done_callback(lambda _: completed.set())
        return completed

    def synchronize(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) for every collective this group started."""
        for work, _ in list(self._pending):
            self.wait(work, "an unfinished collective", timeout_s)

    def abort(self) -> None:
        """Tear the communicator down now (a peer is gone or the round is over); idempotent."""
        if not self.closed:
            self.closed = True
            self._pending = []
            # Kept referenced: on gloo, destroying a group waits for a collective a peer never
            # joined (up to its timeout); abort() itself returns at once.
            self._backend.abort()

    def close(self) -> None:
        """Synchronise, then abort: the clean end of a membership (see the module doc)."""
        if self.closed:
            return
        with contextlib.suppress(RuntimeError):  # already failed: the abort below ends it
            self.synchronize()
        self.abort()
