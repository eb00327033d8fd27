"""An actor engine's membership in the weight broadcast: register with the learner's store,
join each round newer than the engine's weights, and get a ticket the engine's workers use
to receive (weights/receiver.py).

    set members/id=alive, round/v/join/id=slots  ──►  read round/v/roster
                                                       (absent: missed, take the next round)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from weights.rendezvous import CLOSED, POLL_S, PREFIX, TIMEOUTS_KEY, connect_store, round_key

log = logging.getLogger(__name__)


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

    def __init__(
        self, host: str, port: int, *, slots: int = 1, connect_timeout_s: float = 60.0
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.store_host, self.store_port = host, port
        self.slots = slots
        # `leave()` may run in another thread while `wait_round` polls: once it returned,
        # no new join may happen (a seat nobody takes fails the round for everyone).
        self._lock = threading.Lock()
        self._left = False
        self._register(connect_timeout_s)

    def _register(self, connect_timeout_s: float) -> None:
        """Connect to the learner's store, read its timeouts, and take a new member id."""
        self._store = connect_store(
            self.store_host, self.store_port, is_master=False, timeout_s=connect_timeout_s
        )
        # The learner's weight_sync settings are the only ones: it publishes them here.
        timeouts = json.loads(self._store.get(f"{PREFIX}/{TIMEOUTS_KEY}"))
        self.join_timeout_s = float(timeouts["join_timeout_s"])
        self.transfer_timeout_s = float(timeouts["transfer_timeout_s"])
        self._store.set_timeout(timedelta(seconds=self.transfer_timeout_s))
        self.member_id = self._store.add(f"{PREFIX}/members/next_id", 1)
        self._store.set(f"{PREFIX}/members/{self.member_id}", "alive")

    def latest(self) -> int | None:
        """The newest announced round, None before the first or after the sender closed."""
        value = self._store.get(f"{PREFIX}/latest").decode()
        return None if value == CLOSED or int(value) < 0 else int(value)

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
                f"{PREFIX}/{round_key(version, f'join/{self.member_id}')}", str(self.slots)
            )
        # The sender publishes the roster at most join_timeout_s after announcing the round;
        # having joined, wait for it (leaving early would strand a seat in the round, unless
        # leave() marked us `left` first). Polled rather than store.wait: the store client
        # serves one request at a time, and a blocking wait would hold up leave().
        roster_key = f"{PREFIX}/{round_key(version, 'roster')}"
        deadline = time.monotonic() + self.join_timeout_s + 5.0
        while not self._store.check([roster_key]):
            if self._left or time.monotonic() >= deadline:
                return None  # left (no seat for us), or the sender is gone
            time.sleep(POLL_S)
        roster = json.loads(self._store.get(roster_key))
        base_rank = roster["ranks"].get(str(self.member_id))
        if base_rank is None or self._left:
            return None
        backend = self._store.get(f"{PREFIX}/{round_key(version, 'backend')}").decode()
        return RoundTicket(
            version=version,
            base_rank=base_rank,
            world_size=roster["world_size"],
            backend=backend,
            store_host=self.store_host,
            store_port=self.store_port,
            transfer_timeout_s=self.transfer_timeout_s,
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
