"""An engine worker's end of the weight broadcast (called inside the vLLM worker,
weights/engine_side/vllm_worker.py): one store connection and the long-lived group the worker sits
in,
kept from round to round.

    receive(ticket): the ticket's store is not the one we hold? close ours, connect to it
                     round/v/ready/<id> += 1; wait for round/v/go (the group it is sent on)
                     form that group if we do not hold it; yield tensors as buckets arrive
                     round/v/done/<id> += 1
    any failure, or the consumer stopping mid-round: our group is aborted; the next round
    seats us in a fresh one
    the sender failed the round (round/v/failed) or is gone: we stop waiting within
    PEER_CHECK_S, in time to join its next round

Tensors are views into the bucket they arrived in (weights/shared/collective.py): nothing here
keeps a bucket once its tensors are consumed, so a consumer that loads as it goes holds
one or two buckets of host memory (gloo) at a time. A learner that sends deltas
(`weight_sync.delta`) makes the channel keep the version it holds (`ReceiverBook`, a host
copy of the model) and rebuild each tensor from its delta.

A ticket belongs to one store, i.e. one learner process (`RoundTicket.store_id`). When that
learner dies the round is over for us at once: the store's errors end every wait, and a
learner restarted on the same address serves another store, which never says go for a
round it did not plan (waiting there paused the engine for join + transfer timeout).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from weights.shared.collective import Destination, receive_buckets
from weights.shared.communicator import WeightGroup
from weights.shared.delta import DeltaMismatch
from weights.shared.delta_book import ReceiverBook
from weights.shared.membership import Roster
from weights.shared.protocol import RoundTicket
from weights.shared.rendezvous import (
    INFO_KEY,
    POLL_S,
    SKIP,
    connect_store,
    is_listening,
    key,
    roster_key,
    round_key,
    store_id_of,
)

if TYPE_CHECKING:
    import torch


class RoundMissed(RuntimeError):
    """This member was not seated in the group the round went out on (it got ready too
    late and was evicted, or the round was skipped), or the learner that planned the round
    is gone; it takes a later round."""


CONNECT_TIMEOUT_S = 5.0
"""Longest a worker tries to reach the store its ticket came from (moments ago): a live
store answers in milliseconds; one that refuses or stays silent is gone."""


class WeightChannel:
    """The worker at `worker_rank` of its engine (0 .. slots - 1)."""

    def __init__(self, worker_rank: int = 0) -> None:
        self.worker_rank = worker_rank
        self._store = None
        self._store_id: str | None = None
        self.group: WeightGroup | None = None
        self.book = ReceiverBook()
        self.version = -1
        """The round this channel takes part in now, or took part in last."""
        """The version this worker holds, for delta rounds (weights/shared/delta_book.py)."""
        self.wire_s = 0.0
        """The last whole round's time on the wire: waiting for its messages, the work
        between them (loading what arrived) not counted."""

    def _connect(self, ticket: RoundTicket):
        """Our connection to the ticket's store. A ticket of another store (a restarted
        learner, on a new address or the same one) closes the old connection and group.
        The connection we hold to the ticket's own store may be dead (its learner died
        since): the first store call then raises, which ends the round."""
        if self._store is not None and self._store_id != ticket.store_id:
            self.shutdown()
        if self._store is None:
            address = (ticket.store_host, ticket.store_port)
            _refuse_silent_store(*address, ticket.version)
            store = connect_store(
                *address,
                is_master=False,
                timeout_s=min(CONNECT_TIMEOUT_S, ticket.transfer_timeout_s),
            )
            store.set_timeout(timedelta(seconds=ticket.transfer_timeout_s))
            found = store_id_of(store)
            if found != ticket.store_id:
                raise RoundMissed(
                    f"round {ticket.version}: the learner that planned it is gone (the store "
                    f"at {address[0]}:{address[1]} is {found!r} now, not {ticket.store_id!r})"
                )
            self._store, self._store_id = store, found
        return self._store

    def receive(
        self, ticket: RoundTicket, destination: Destination | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Take part in round `ticket.version`: yield (name, tensor) as they arrive (on CUDA
        for nccl, CPU for gloo); a tensor travelling alone into the memory `destination`
        offers for it (`receive_buckets`). RoundMissed when not seated; RuntimeError when the
        round failed (our group is aborted then)."""
        store = self._connect(ticket)
        self.version = ticket.version
        member = ticket.member_id
        store.add(round_key(ticket.version, f"ready/{member}"), 1)
        go = self._wait_go(store, ticket)
        if go == SKIP:
            raise RoundMissed(f"round {ticket.version} was skipped")
        roster = Roster.from_json(json.loads(store.get(roster_key(int(go)))))
        if member not in roster.slots:
            raise RoundMissed(f"member {member} was not ready in time for {ticket.version}")
        try:
            group = self._group_for(store, ticket, roster)
            waited_s = group.waited_s
            yield from self.book.decode(receive_buckets(group, destination))
            self.wire_s = group.waited_s - waited_s
        # Failed, closed mid-round by a consumer that stopped (its load failed), or a delta
        # we cannot apply: the group is mid-broadcast, so abort it (the sender's next send
        # fails at once, and its next round is a keyframe); what we hold is now unknown.
        except (RuntimeError, GeneratorExit, DeltaMismatch):
            self.book.forget()
            self.abort()
            raise
        store.add(round_key(ticket.version, f"done/{member}"), 1)

    def _wait_go(self, store, ticket: RoundTicket) -> str:
        """The group the round goes out on; decided within join_timeout_s of its start."""
        go_key = round_key(ticket.version, "go")
        deadline = time.monotonic() + ticket.join_timeout_s + ticket.transfer_timeout_s
        while not store.check([go_key]):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"round {ticket.version}: the sender never said go")
            time.sleep(POLL_S)
        return store.get(go_key).decode()

    def _group_for(self, store, ticket: RoundTicket, roster: Roster) -> WeightGroup:
        if self.group is not None and self.group.group_id == roster.group_id:
            return self.group
        self.close()
        if roster.backend == "nccl":
            _refuse_learner_gpu(json.loads(store.get(key(INFO_KEY)))["gpu_uuid"])
        self.group = WeightGroup(
            store,
            ticket.store_host,
            roster.group_id,
            roster.ranks[ticket.member_id] + self.worker_rank,
            roster.world_size,
            roster.backend,
            ticket.transfer_timeout_s,
            why_stop=lambda: _why_stop(store, self.version),  # the store's learner sends
        )
        return self.group

    def abort(self) -> None:
        if self.group is not None:
            self.group.abort()
        self.group = None

    def close(self) -> None:
        """Leave the current group cleanly (synchronised, then aborted)."""
        if self.group is not None:
            self.group.close()
        self.group = None

    def shutdown(self) -> None:
        """Close the group and the store connection (the engine is stopping, or the learner
        it was connected to is gone)."""
        self.close()
        self._store, self._store_id = None, None
        self.book.forget()  # deltas come from one learner's book


def _why_stop(store, version: int) -> str | None:
    """Why round `version` is over for us though our collective has not finished: its sender
    failed it, or is gone (its store stopped answering). One store round trip."""
    try:
        failed = store.check([round_key(version, "failed")])
    except RuntimeError:  # DistNetworkError, DistStoreError: the server went away
        return "the sender is gone (its store stopped answering)"
    return f"the sender failed round {version}" if failed else None


def _refuse_silent_store(host: str, port: int, version: int) -> None:
    """RoundMissed at once when nothing listens at the store's address: its learner died
    after handing out the ticket (torch's client would retry the refused connection until
    its timeout, with the engine paused)."""
    if not is_listening(host, port, CONNECT_TIMEOUT_S):
        raise RoundMissed(f"round {version}: the learner's store at {host}:{port} is gone")


def _refuse_learner_gpu(learner_uuid: str) -> None:
    import torch

    ours = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    if learner_uuid and ours == learner_uuid:
        raise ValueError(
            f"this engine shares GPU {ours} with the learner: NCCL cannot put two ranks of "
            "one communicator on one GPU. Set learner.weight_sync.backend = 'gloo' (make "
            "run's placement plan does this when it co-locates, docs/gpu.md)"
        )


def receive_round(
    ticket: RoundTicket, *, worker_rank: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """One round on a channel of its own, closed afterwards (tests and one-shot tools; an
    engine keeps its `WeightChannel` across rounds)."""
    channel = WeightChannel(worker_rank)
    try:
        yield from channel.receive(ticket)
    finally:
        channel.close()
