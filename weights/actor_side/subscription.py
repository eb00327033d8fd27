"""An actor engine's membership in the weight broadcast: register with the learner's store
(refused when the engine's dtype is not the learner's), and for each round newer than the
engine's weights, a ticket its workers receive with (weights/engine_side/receiver.py).

    register: members/id = alive, members/id/slots  ──►  seated in the next group formed
    wait_round: latest = v > ours; round/v/group = g; seated in g?  ──►  RoundTicket
                not seated (new, or evicted): ask again (alive), take a later round;
                missed_version = v (until that round, only a snapshot brings v)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import timedelta

from common.repeats import Repeats
from weights.formats.adapter import adapter_mismatch
from weights.shared.dtypes import dtype_mismatch
from weights.shared.protocol import RoundTicket
from weights.shared.rendezvous import (
    CLOSED,
    INFO_KEY,
    NO_GROUP,
    connect_store,
    is_listening,
    key,
    roster_key,
    round_key,
)

log = logging.getLogger(__name__)

RECONNECT_S = 5.0
"""Longest one reconnection to a learner's store that accepts connections may take."""


class WeightDtypeMismatch(ValueError):
    """The engine's dtype is not the learner's: refused at start-up, with what to change."""


class AdapterMismatch(ValueError):
    """The engine cannot load the learner's LoRA adapter (rank above its max_lora_rank)."""


class WeightSubscription:
    """One actor engine's membership: `wait_round(after_version)` returns the ticket of the
    next round it is seated in; the engine's workers then receive with a `WeightChannel`.
    `slots` is the number of engine workers that each take a rank (tensor x pipeline
    parallel size); `dtype` the engine's resolved dtype (None: not checked);
    `max_lora_rank` the largest adapter an engine with vLLM's LoRA loads (None: it merges
    adapters, any rank)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        slots: int = 1,
        dtype: str | None = None,
        max_lora_rank: int | None = None,
        connect_timeout_s: float = 60.0,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.store_host, self.store_port = host, port
        self.slots = slots
        self.dtype = dtype
        self.max_lora_rank = max_lora_rank
        # `leave()` may run in another thread while `wait_round` polls: once it returned,
        # this member is marked left and asks for no seat again.
        self._lock = threading.Lock()
        self._left = False
        self._unreachable = Repeats()  # a line at once, then one per 30 s while it repeats
        self._register(connect_timeout_s)

    def _register(self, connect_timeout_s: float) -> None:
        """Connect to the learner's store, check dtypes, read its timeouts, take a new id."""
        self._store = connect_store(
            self.store_host, self.store_port, is_master=False, timeout_s=connect_timeout_s
        )
        info = json.loads(self._store.get(key(INFO_KEY)))
        mismatch = self.dtype and dtype_mismatch(info["dtype"], self.dtype)
        if mismatch:
            raise WeightDtypeMismatch(mismatch)
        self.store_id = info.get("store_id", "")
        self.payload = info.get("payload", "full")
        self.adapter_config = info.get("adapter_config")
        if self.payload == "lora":
            refused = adapter_mismatch(self.adapter_config, self.max_lora_rank)
            if refused:
                raise AdapterMismatch(refused)
        self.join_timeout_s = float(info["join_timeout_s"])
        self.transfer_timeout_s = float(info["transfer_timeout_s"])
        self._store.set_timeout(timedelta(seconds=self.transfer_timeout_s))
        self._lost = False  # the store stopped answering: register anew before asking it
        self.member_id = self._store.add(key("members/next_id"), 1)
        self.missed_version = -1  # the newest round of this store that did not seat us
        self._store.set(key(f"members/{self.member_id}/slots"), str(self.slots))
        self._store.set(key(f"members/{self.member_id}"), "alive")

    def latest(self) -> int | None:
        """The newest announced round, None before the first or after the sender closed."""
        value = self._store.get(key("latest")).decode()
        return None if value == CLOSED or int(value) < 0 else int(value)

    def wait_round(
        self, after_version: int, timeout_s: float, failed: RoundTicket | None = None
    ) -> RoundTicket | None:
        """The ticket of the first round newer than `after_version` that seats us; None if
        none did within `timeout_s`, or after `leave()`. A new member is seated in the first
        group formed after it registered: it joins at the next version. Never a round that
        did not seat us, nor the `failed` one (its roster still seats us, but the sender
        gave up on it), unless it was another store's: a restarted learner's round of the
        same version is another round. Survives a learner restart (reconnects and
        registers anew). Blocking: run it in a thread."""
        import torch.distributed as dist

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._left:
            if self._lost:
                self._reconnect(deadline)
                continue
            after = max(after_version, self.missed_version)
            if failed is not None and failed.store_id == self.store_id:
                after = max(after, failed.version)
            try:
                version = self.latest()
                if version is None or version <= after:
                    time.sleep(0.02)
                    continue
                ticket = self._seat(version)
            except dist.DistError as e:
                # The learner's store is gone (restart, crash): reconnect until the deadline
                # (this wait's and the next ones': the dead connection is not asked again).
                # No traceback: where and why is the whole story.
                self._unreachable.warning(
                    log,
                    "weight store at %s:%d unreachable (%s): the learner stopped or "
                    "restarted; reconnecting when something listens there again",
                    self.store_host,
                    self.store_port,
                    e,
                )
                self._lost = True
                continue
            if ticket is not None:
                return ticket
            # Not seated in this one: take a later round. Until it comes the engine can
            # reach `version` only from a snapshot (the learner may wait for our data).
            self.missed_version = max(self.missed_version, version)
        return None

    def _reconnect(self, deadline: float) -> None:
        """Register anew as soon as something listens at the store's address again (a
        restarted learner), or give up at `deadline` or on `leave()`. A plain connect asks
        first: torch's client backs off (7.9 s seen) past the new store's start."""
        import torch.distributed as dist

        while time.monotonic() < deadline and not self._left:
            time.sleep(0.2)
            if not is_listening(self.store_host, self.store_port, RECONNECT_S):
                continue
            try:
                self._register(min(RECONNECT_S, max(0.5, deadline - time.monotonic())))
                log.info(
                    "weight store at %s:%d is back (store %s): registered as member %d",
                    self.store_host,
                    self.store_port,
                    self.store_id,
                    self.member_id,
                )
                return
            except dist.DistError:
                pass  # not up after all: try again while time remains

    def _seat(self, version: int) -> RoundTicket | None:
        """Our ticket for round `version`, or None (and a request to be seated) if its
        group does not hold us."""
        group_key = round_key(version, "group")
        if not self._store.check([group_key]):
            return None  # a round already forgotten
        group = self._store.get(group_key).decode()
        seated = False
        if group != NO_GROUP and self._store.check([roster_key(int(group))]):
            roster = json.loads(self._store.get(roster_key(int(group))))
            seated = str(self.member_id) in roster["slots"]
        with self._lock:
            if self._left:
                return None
            if not seated:
                # New (the next group seats us) or evicted (ask again).
                self._store.set(key(f"members/{self.member_id}"), "alive")
                return None
        return RoundTicket(
            version=version,
            group_id=int(group),
            member_id=self.member_id,
            slots=self.slots,
            store_host=self.store_host,
            store_port=self.store_port,
            join_timeout_s=self.join_timeout_s,
            transfer_timeout_s=self.transfer_timeout_s,
            store_id=self.store_id,
            payload=self.payload,
            adapter_config=self.adapter_config,
        )

    @property
    def left(self) -> bool:
        """True once `leave()` was called: this subscription joins no more rounds."""
        return self._left

    def leave(self) -> None:
        """Tell the sender not to wait for us any more (our seat goes at its next group).
        Thread-safe: a `wait_round` running in another thread returns None. A store found
        gone is not asked: its sender is gone too, and torch would print a C++ backtrace for
        the request on the dead connection."""
        with self._lock:
            self._left = True
            if not self._lost:
                self._store.set(key(f"members/{self.member_id}"), "left")
