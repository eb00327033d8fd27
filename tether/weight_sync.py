"""Weight broadcast from learner rank 0 to the actors' engine workers, one round per version.

Each round forms a fresh stateless process group (a `TCPStore` served by the learner, keys
under a per-round prefix, `ProcessGroupGloo` on CPU / `ProcessGroupNCCL` on GPU) and never
touches anyone's default group. Actors come and go, so membership is settled per round:

    learner (WeightSender.broadcast(v))          actor (WeightSubscription.wait_round)
    set round/v/backend, latest=v   ───────────►  sees latest=v > its version
    poll round/v/join/* until every  ◄─────────── set members/id=alive, round/v/join/id=slots
      alive member joined or join_timeout
    set round/v/roster (id -> base rank);         reads roster (absent -> missed, next round)
      evict members that did not join
    ProcessGroup(rank 0, 1 + slots)  ◄─────────►  worker: ProcessGroup(base rank + worker rank)
    send_buckets ───────────────────────────────►  receive_buckets   (tether/weight_buckets.py)

A dead actor costs the sender at most one `join_timeout_s` (then it is evicted and never
waited on again; a live one that was merely slow rejoins by setting itself alive), and a
receiver that joins but dies mid-round fails that round within `transfer_timeout_s`; the
sender reports the failure and the learner carries on. Every round carries full tensors, so
a receiver that missed rounds is current again after the next one it joins. A member that
`leave()`s (its actor stops) is given no seat, even if its polling thread had just joined.

torch is imported inside functions so that configs importing `WeightSyncConfig` stay fast.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pydantic

from tether.config import StrictModel
from tether.weight_buckets import receive_buckets, send_buckets

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

PREFIX = "tether/weights"
_CLOSED = "closed"
_POLL_S = 0.005


class WeightSyncConfig(StrictModel):
    """Where the learner serves the weight store and how long it waits for actors."""

    store_host: str = "127.0.0.1"
    """Host of the learner's TCPStore (learner binds it; actors connect to it)."""
    store_port: int = 29650
    """Port of the learner's TCPStore."""
    bucket_mb: float = 64.0
    """Target bucket size: tensors are packed into flat buffers of about this many MB."""
    join_timeout_s: float = 10.0
    """Longest the sender waits for registered actors to join a round."""
    transfer_timeout_s: float = 60.0
    """Timeout of the round's process group: forming it and every broadcast in it."""
    backend: str = "auto"
    """`auto` (nccl when the learner has CUDA, else gloo), `gloo` or `nccl`."""

    @pydantic.field_validator("bucket_mb", "join_timeout_s", "transfer_timeout_s")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"must be > 0, got {value}")
        return value

    @pydantic.field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {value!r}")
        return value


# ---- process group of one round ---------------------------------------------------------------


def assign_ranks(joined: dict[int, int]) -> tuple[dict[str, int], int]:
    """{member id: slots} -> ({member id: its first rank}, world size). The sender is rank
    0; members follow in id order, each taking `slots` consecutive ranks."""
    ranks, next_rank = {}, 1
    for member_id in sorted(joined):
        if joined[member_id] < 1:
            raise ValueError(f"member {member_id} asks for {joined[member_id]} slots")
        ranks[str(member_id)] = next_rank
        next_rank += joined[member_id]
    return ranks, next_rank


def _round_key(version: int, key: str) -> str:
    return f"round/{version}/{key}"


def _connect_store(host: str, port: int, *, is_master: bool, timeout_s: float):
    """A TCPStore client, or with `is_master` the server, listening on `host` only (port 0:
    a free one) rather than on every interface."""
    import torch.distributed as dist

    listen_fd = None
    if is_master:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listen_fd = socket.create_server((host, port), family=family, backlog=1024).detach()
    return dist.TCPStore(
        host,
        port,
        is_master=is_master,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=listen_fd,
        use_libuv=True,
    )


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def round_group(
    store, host: str, version: int, rank: int, world_size: int, backend: str, timeout_s: float
):
    """The process group of round `version`: its own key prefix in the shared store, so it
    neither needs nor disturbs a default group. Blocks until all ranks joined (or raises
    after `timeout_s`)."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"{PREFIX}/{_round_key(version, 'pg')}", store)
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # Bind gloo to loopback when the store is local, so nothing leaves 127.0.0.1.
        device = (
            dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
            if _is_loopback(host)
            else dist.ProcessGroupGloo.create_default_device()
        )
        options._devices = [device]
        return dist.ProcessGroupGloo(prefixed, rank, world_size, options)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    raise ValueError(f"unknown backend {backend!r}")


def _drain(iterator: Iterator) -> None:
    for _ in iterator:
        pass


# ---- learner side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BroadcastReport:
    version: int
    num_receivers: int
    """Members in the round's roster."""
    num_tensors: int
    num_bytes: int
    join_s: float
    """Time spent waiting for members to join."""
    transfer_s: float
    """Time to form the group and broadcast every bucket."""
    missed: tuple[int, ...] = ()
    """Member ids expected but absent (now evicted)."""
    error: str = ""
    """Why the round failed (empty when it succeeded)."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def mb_per_s(self) -> float:
        return self.num_bytes / 1e6 / self.transfer_s if self.transfer_s > 0 else 0.0


class WeightSender:
    """Learner rank 0: serves the store and broadcasts one round per version.

    `sender = WeightSender(config)`; after each optimizer step
    `sender.broadcast(version, model_named_tensors)` (blocking; run it in a thread from
    async code). Tensors may live on any device; they are streamed bucket by bucket.
    """

    def __init__(self, config: WeightSyncConfig) -> None:
        import torch

        self.backend = config.backend
        if self.backend == "auto":
            self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self._store = _connect_store(
            config.store_host,
            config.store_port,
            is_master=True,
            timeout_s=config.transfer_timeout_s,
        )
        # store_port 0 picks a free port; the config then says which one actors must use.
        self.config = config.model_copy(update={"store_port": self._store.port})
        self._store.set(f"{PREFIX}/latest", "-1")
        self._last_version: int | None = None

    def _key(self, key: str) -> str:
        return f"{PREFIX}/{key}"

    def members(self) -> dict[int, str]:
        """{member id: state} of every registered subscription: `alive` (expected in the
        next round), `evicted` (missed a round; expected again once it joins one) or `left`."""
        num_ids = self._store.add(self._key("members/next_id"), 0)
        ids = list(range(1, num_ids + 1))
        keys = [self._key(f"members/{i}") for i in ids]
        present = [i for i, key in zip(ids, keys, strict=True) if self._store.check([key])]
        if not present:
            return {}
        values = self._store.multi_get([self._key(f"members/{i}") for i in present])
        return {i: v.decode() for i, v in zip(present, values, strict=True)}

    def _joined(self, version: int, ids: Iterable[int]) -> dict[int, int]:
        out = {}
        for i in ids:
            key = self._key(_round_key(version, f"join/{i}"))
            if self._store.check([key]):
                out[i] = int(self._store.get(key))
        return out

    def _gather_roster(self, version: int) -> tuple[dict[int, int], tuple[int, ...]]:
        """Wait until every alive member joined or the join timeout passed; returns
        {member id: slots} of those that joined and the ids that did not (evicted)."""
        deadline = time.monotonic() + self.config.join_timeout_s
        while True:
            states = self.members()
            alive = [i for i, s in states.items() if s == "alive"]
            # A member that left after joining (its actor stopped) gets no seat: nobody
            # would take it, and the round would fail for everyone after transfer_timeout_s.
            joined = self._joined(version, [i for i, s in states.items() if s != "left"])
            if all(i in joined for i in alive) or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        missed = tuple(i for i in alive if i not in joined)
        for i in missed:
            self._store.set(self._key(f"members/{i}"), "evicted")
        return joined, missed

    def broadcast(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> BroadcastReport:
        """Run round `version`: gather the members that join, then stream every tensor to
        them. Never raises for a failed receiver: the report says what happened.

        `named_tensors` is always run to the end, even with nobody to send to or after a
        failure: under FSDP every rank gathers each tensor in lockstep with rank 0's
        iteration, and the other ranks must not be left waiting in an all-gather."""
        if self._last_version is not None and version <= self._last_version:
            raise ValueError(f"version {version} is not newer than {self._last_version}")
        self._last_version = version
        try:
            return self._round(version, iter(named_tensors))
        finally:
            self._forget_rounds_before(version)

    def _forget_rounds_before(self, version: int) -> None:
        """Delete older rounds' keys (join marks, rosters, the groups' own keys), so the
        store does not grow with every step."""
        prefix = self._key("round/")
        for key in self._store.list_keys():
            if key.startswith(prefix) and int(key[len(prefix) :].split("/", 1)[0]) < version:
                self._store.delete_key(key)

    def _round(
        self, version: int, named_tensors: Iterator[tuple[str, torch.Tensor]]
    ) -> BroadcastReport:
        started = time.monotonic()
        self._store.set(self._key(_round_key(version, "backend")), self.backend)
        self._store.set(self._key("latest"), str(version))
        joined, missed = self._gather_roster(version)
        roster, world_size = assign_ranks(joined)
        self._store.set(
            self._key(_round_key(version, "roster")),
            json.dumps({"world_size": world_size, "ranks": roster}),
        )
        join_s = time.monotonic() - started
        report = dict(
            version=version,
            num_receivers=len(roster),
            num_tensors=0,
            num_bytes=0,
            join_s=join_s,
            transfer_s=0.0,
            missed=missed,
        )
        if not roster:
            _drain(named_tensors)
            return BroadcastReport(**report)
        started = time.monotonic()
        try:
            group = round_group(
                self._store,
                self.config.store_host,
                version,
                0,
                world_size,
                self.backend,
                self.config.transfer_timeout_s,
            )
            num_tensors, num_bytes = send_buckets(
                group,
                named_tensors,
                backend=self.backend,
                bucket_bytes=int(self.config.bucket_mb * 2**20),
            )
        except RuntimeError as e:
            # A receiver died or hung (DistError/gloo errors are RuntimeErrors): this round
            # is lost for everyone in it; the learner goes on, receivers retry next round.
            log.warning("weight round %d failed: %s", version, e)
            _drain(named_tensors)
            report.update(transfer_s=time.monotonic() - started, error=str(e))
            return BroadcastReport(**report)
        report.update(
            num_tensors=num_tensors, num_bytes=num_bytes, transfer_s=time.monotonic() - started
        )
        return BroadcastReport(**report)

    def close(self) -> None:
        self._store.set(self._key("latest"), _CLOSED)
        del self._store


# ---- actor side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundTicket:
    """A receiver's seat in one round: what its engine workers need to form the group."""

    version: int
    base_rank: int
    world_size: int
    backend: str
    store_host: str
    store_port: int
    transfer_timeout_s: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class WeightSubscription:
    """One actor engine's membership: `wait_round(after_version)` joins the next round and
    returns its ticket; the engine's workers then receive with `receive_round(ticket, ...)`.
    `slots` is the number of engine workers that each take a rank (tensor x pipeline
    parallel size)."""

    def __init__(self, config: WeightSyncConfig, *, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.config = config
        self.slots = slots
        # `leave()` may run in another thread while `wait_round` polls: once it returned,
        # no new join may happen (a seat nobody takes fails the round for everyone).
        self._lock = threading.Lock()
        self._left = False
        self._register(config.transfer_timeout_s)

    def _register(self, connect_timeout_s: float) -> None:
        """Connect to the learner's store and take a new member id."""
        self._store = _connect_store(
            self.config.store_host,
            self.config.store_port,
            is_master=False,
            timeout_s=connect_timeout_s,
        )
        self._store.set_timeout(timedelta(seconds=self.config.transfer_timeout_s))
        self.member_id = self._store.add(f"{PREFIX}/members/next_id", 1)
        self._store.set(f"{PREFIX}/members/{self.member_id}", "alive")

    def latest(self) -> int | None:
        """The newest announced round, None before the first or after the sender closed."""
        value = self._store.get(f"{PREFIX}/latest").decode()
        return None if value == _CLOSED or int(value) < 0 else int(value)

    def wait_round(self, after_version: int, timeout_s: float) -> RoundTicket | None:
        """Join the first round newer than `after_version` that still admits us; None if
        none did within `timeout_s` (once joined, it waits for that round's roster, at most
        `join_timeout_s` more). Survives a learner restart: it reconnects and registers
        anew. Returns None at once after `leave()`. Blocking: run it in a thread from async
        code."""
        import torch.distributed as dist

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._left:
            try:
                version = self.latest()
                if version is None or version <= after_version:
                    time.sleep(0.02)
                    continue
                ticket = self._join(version)
            except dist.DistError as e:
                # The learner's store is gone (restart, crash): reconnect until the deadline.
                log.warning("weight store unreachable (%s); reconnecting", e)
                time.sleep(0.5)
                if self._left:
                    return None
                try:
                    self._register(max(0.5, deadline - time.monotonic()))
                except dist.DistError:
                    pass  # still down: try again while time remains
                continue
            if ticket is not None:
                return ticket
            after_version = version  # missed it (closed before we joined): take the next
        return None

    def _join(self, version: int) -> RoundTicket | None:
        with self._lock:
            if self._left:
                return None
            self._store.set(f"{PREFIX}/members/{self.member_id}", "alive")
            self._store.set(
                f"{PREFIX}/{_round_key(version, f'join/{self.member_id}')}", str(self.slots)
            )
        # The sender publishes the roster at most join_timeout_s after announcing the round;
        # having joined, wait for it (leaving early would strand a seat in the round, unless
        # leave() marked us `left` first). Polled rather than store.wait: the store client
        # serves one request at a time, and a blocking wait would hold up leave().
        roster_key = f"{PREFIX}/{_round_key(version, 'roster')}"
        deadline = time.monotonic() + self.config.join_timeout_s + 5.0
        while not self._store.check([roster_key]):
            if self._left or time.monotonic() >= deadline:
                return None  # left (no seat for us), or the sender is gone
            time.sleep(_POLL_S)
        roster = json.loads(self._store.get(roster_key))
        base_rank = roster["ranks"].get(str(self.member_id))
        if base_rank is None or self._left:
            return None
        backend = self._store.get(f"{PREFIX}/{_round_key(version, 'backend')}").decode()
        return RoundTicket(
            version=version,
            base_rank=base_rank,
            world_size=roster["world_size"],
            backend=backend,
            store_host=self.config.store_host,
            store_port=self.config.store_port,
            transfer_timeout_s=self.config.transfer_timeout_s,
        )

    @property
    def left(self) -> bool:
        """True once `leave()` was called: this subscription joins no more rounds."""
        return self._left

    def leave(self) -> None:
        """Tell the sender not to wait for us any more. Thread-safe: a `wait_round` running
        in another thread joins no round after this returns, and returns None."""
        with self._lock:
            self._left = True
            self._store.set(f"{PREFIX}/members/{self.member_id}", "left")


def receive_round(
    ticket: RoundTicket, *, worker_rank: int = 0, store=None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Worker side of a round: form the group at rank base_rank + worker_rank and yield
    (name, tensor) as they arrive. Tensors are on CUDA for nccl, CPU for gloo."""
    if store is None:
        store = _connect_store(
            ticket.store_host,
            ticket.store_port,
            is_master=False,
            timeout_s=ticket.transfer_timeout_s,
        )
    group = round_group(
        store,
        ticket.store_host,
        ticket.version,
        ticket.base_rank + worker_rank,
        ticket.world_size,
        ticket.backend,
        ticket.transfer_timeout_s,
    )
    yield from receive_buckets(group, backend=ticket.backend)
