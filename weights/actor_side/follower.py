"""Keep an engine current: join every weight round newer than its weights and apply it in
flight, across failed rounds and learner restarts.

    BroadcastFollower.run ─► WeightSubscription(address)      (register with the store)
                               └─ loop: wait_round(engine.version) ─► engine.update_weights
                                        failed round: on_failure(error), join the next
                                        (weights mixed: the actor loads a snapshot there)
                             store lost (learner restarting): pause, register anew

The engine is anything with the `WeightReceiver` shape: the vLLM engine (actors/vllm_engine.py)
or a fake in the tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from common.repeats import Repeats
from weights.actor_side.subscription import WeightSubscription
from weights.shared.protocol import RoundTicket

log = logging.getLogger(__name__)


class WeightUpdateError(RuntimeError):
    """A weight round or snapshot load failed in the engine worker; the engine still runs
    and keeps its old version. `weights_mixed`: the load stopped part-way (some layers new,
    some old), so the engine keeps generation paused until a whole load."""

    def __init__(self, message: str, *, weights_mixed: bool = False) -> None:
        super().__init__(message)
        self.weights_mixed = weights_mixed


@dataclass(frozen=True)
class WeightUpdate:
    """What one in-flight update cost."""

    version: int
    stall_s: float
    """Time generation was paused: pause + (streamed: receive +) load + relabel and resume."""
    pause_s: float
    """Time the pause took (the running engine step finishing)."""
    receive_s: float
    """Forming the round's group and receiving every bucket (slowest worker); for a staged
    round, spent before the pause while the engine generated: not part of `stall_s`."""
    load_s: float
    """reload_weights (slowest worker)."""
    num_bytes: int
    wire_s: float = 0.0
    """Of `receive_s`, the round's messages' time on the wire (slowest worker): the
    broadcast's own speed, whatever the loads between them took."""


class WeightReceiver(Protocol):
    version: int
    """Policy version of the weights loaded now."""
    num_weight_slots: int
    """Ranks the engine takes in a round (one per worker)."""
    dtype: str
    """The engine's resolved dtype (the learner refuses another)."""

    async def update_weights(self, ticket: RoundTicket) -> WeightUpdate:
        """Receive and load round `ticket`; WeightUpdateError if it failed."""
        ...


async def follow_weights(
    engine: WeightReceiver,
    subscription: WeightSubscription,
    *,
    poll_s: float = 1.0,
    on_update: Callable[[WeightUpdate], None] | None = None,
    on_failure: Callable[[WeightUpdateError], Awaitable[None]] | None = None,
) -> None:
    """Keep `engine` current: join every weight round after its version, until the task is
    cancelled or the subscription left. `on_update(WeightUpdate)` is called after each
    successful update, `await on_failure(error)` after each failed one (before the next
    wait, so a snapshot it loads never races a round). Each wait for a round lasts at most
    `poll_s`: it goes on from the engine's version as it was, so a rollback (a snapshot
    load back to a resumed learner's version) takes effect at the next wait (with 5 s, the
    resumed learner's first round waited up to 4 s for the engines)."""
    failed: RoundTicket | None = None
    while not subscription.left:
        # Never the failed round again: joining it would pause generation for another
        # transfer timeout, again and again, while the learner waits for the trajectories
        # we do not generate. A restarted learner's round of the same version is another
        # round, and ours to take (the subscription tells them apart).
        ticket = await asyncio.to_thread(subscription.wait_round, engine.version, poll_s, failed)
        if ticket is None:
            continue
        try:
            update = await engine.update_weights(ticket)
        except WeightUpdateError as e:
            # The round failed (the learner or a peer died mid-broadcast); the weights are
            # the old ones unless `e.weights_mixed`. Join the next round.
            log.warning("weight update to version %d failed: %s", ticket.version, e)
            failed = ticket
            if on_failure is not None:
                await on_failure(e)
            continue
        if on_update is not None:
            on_update(update)


class BroadcastFollower:
    """Follows the broadcast served at `address` ("host:port" of the learner's store) for
    one engine, forever: `await follower.run()` in a task; `await follower.leave()` before
    the engine stops, so the learner stops counting on it."""

    def __init__(
        self,
        engine: WeightReceiver,
        address: str,
        *,
        on_update: Callable[[WeightUpdate], None] | None = None,
        on_failure: Callable[[WeightUpdateError], Awaitable[None]] | None = None,
        retry_s: float = 2.0,
    ) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"broadcast address {address!r} must look like host:port")
        self.engine, self.address = engine, address
        self.host, self.port = host, int(port)
        self.on_update, self.on_failure = on_update, on_failure
        self.retry_s = retry_s
        self.subscription: WeightSubscription | None = None
        self._unavailable = Repeats()  # a line at once, then one per 30 s while it repeats

    async def run(self) -> None:
        while True:
            try:
                self.subscription = await asyncio.to_thread(
                    WeightSubscription,
                    self.host,
                    self.port,
                    slots=self.engine.num_weight_slots,
                    dtype=getattr(self.engine, "dtype", None),
                    max_lora_rank=getattr(self.engine, "max_lora_rank", None),
                )
                await follow_weights(
                    self.engine,
                    self.subscription,
                    on_update=self.on_update,
                    on_failure=self.on_failure,
                )
                return  # left
            # Network boundary: the learner's TCPStore is unreachable (torch raises
            # DistStoreError, a RuntimeError) or went away; try again shortly.
            except (RuntimeError, OSError, TimeoutError) as e:
                self._unavailable.warning(
                    log, "weight broadcast at %s unavailable (%s); retrying", self.address, e
                )
                self.subscription = None
                await asyncio.sleep(self.retry_s)

    @property
    def missed_version(self) -> int:
        """The newest round of the current store that did not seat this engine (-1: none):
        until the next round, only a snapshot brings that version."""
        return self.subscription.missed_version if self.subscription is not None else -1

    async def leave(self) -> None:
        subscription, self.subscription = self.subscription, None
        if subscription is not None:
            # Network boundary: the store may be gone already (the learner stopped first).
            try:
                await asyncio.to_thread(subscription.leave)
            except (RuntimeError, OSError) as e:
                log.info("leaving the weight broadcast at %s: %s", self.address, e)
        close = getattr(self.engine, "close_weight_channel", None)
        if close is not None:
            # The engine workers' communicator, synchronised and torn down (the engine may
            # have died already: then there is nothing to close).
            try:
                await close()
            except (RuntimeError, WeightUpdateError) as e:
                log.info("closing the weight channel: %s", e)
