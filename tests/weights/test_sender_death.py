"""A learner that dies during a weight round (docs/reliability.md): the receiver learns it
at once and gives the round up, whether the learner died before its worker reached the store, while
it waited for "go", or mid-transfer; and whether or not a restarted learner already
serves a store on the same address (the launcher restarts it within a second or two).
Waiting instead paused every engine for join + transfer timeout (36 s in the fault suite).

The learner's side runs in a process of its own (sender_process.py), killed with SIGKILL;
the receiver is an engine worker's channel in this process, over real gloo."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.weights.dying_learner import (
    ENDS_WITHIN_S,
    VERSION,
    exited_at,
    kill,
    seat,
    start_sender,
)
from weights.actor_side.subscription import WeightSubscription
from weights.config import WeightSyncConfig
from weights.engine_side.receiver import RoundMissed, WeightChannel
from weights.learner_side.sender import WeightSender
from weights.shared.protocol import RoundTicket
from weights.shared.rendezvous import connect_store, round_key


def receive_until_it_ends(
    channel: WeightChannel, ticket: RoundTicket
) -> tuple[float, RuntimeError]:
    """(seconds until the round ended for the receiver, why)."""
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:  # RoundMissed, gloo's, the store's
        for _ in channel.receive(ticket):
            pass
    return time.monotonic() - started, raised.value


@pytest.mark.parametrize("restarted", [True, False], ids=["restarted", "gone"])
def test_a_learner_dead_before_the_worker_reaches_its_store_ends_the_round_at_once(restarted):
    # The ticket was handed out; then the learner died while the engine paused (the worker
    # had not connected yet). Today's restart serves another store on the same port.
    proc, _, ticket = seat("hold")
    kill(proc)
    restart = start_sender(ticket.store_port, "idle")[0] if restarted else None
    channel = WeightChannel()
    try:
        took_s, why = receive_until_it_ends(channel, ticket)
    finally:
        channel.shutdown()
        kill(restart)
    assert took_s < ENDS_WITHIN_S, why
    assert isinstance(why, RoundMissed) and "gone" in str(why)


def test_a_learner_dead_while_the_worker_waits_for_go_ends_the_round_at_once():
    proc, _, ticket = seat("hold")  # go never comes: the round waits for a phantom member
    channel, restart = WeightChannel(), None
    try:
        weights = channel.receive(ticket)
        probe = connect_store("127.0.0.1", ticket.store_port, is_master=False, timeout_s=5)
        ready_key = round_key(VERSION, f"ready/{ticket.member_id}")
        killed_at = []

        def kill_once_ready() -> None:
            nonlocal restart
            while probe.add(ready_key, 0) < 1:
                time.sleep(0.01)
            kill(proc)
            killed_at.append(time.monotonic())
            restart = start_sender(ticket.store_port, "idle")[0]

        killer = threading.Thread(target=kill_once_ready)
        killer.start()
        with pytest.raises(RuntimeError):
            next(weights)
        ended_at = time.monotonic()
        killer.join(timeout=30)
    finally:
        channel.shutdown()
        kill(proc)
        kill(restart)
    assert ended_at - killed_at[0] < ENDS_WITHIN_S


def test_a_learner_dead_mid_transfer_ends_the_round_at_once():
    proc, _, ticket = seat("die_after_go")  # exits 0.2 s after its first bucket left
    channel = WeightChannel()
    try:
        _, why = receive_until_it_ends(channel, ticket)
        ended_at = time.time()
        died_at = exited_at(proc)
    finally:
        channel.shutdown()
        kill(proc)
    assert ended_at - died_at < ENDS_WITHIN_S, why
    assert channel.group is None  # aborted: the next round forms a fresh group


def test_the_restarted_learners_round_of_the_same_version_is_taken_on_a_fresh_connection():
    """The other half of the store's identity: after a failed round 5 of the dead learner,
    the restarted one's own round 5 (it resumed below it) is another round, and ours."""
    proc, subscription, ticket = seat("hold")
    kill(proc)
    second = WeightSender(
        WeightSyncConfig(store_port=ticket.store_port, join_timeout_s=2.0, transfer_timeout_s=3.0)
    )
    channel, result = WeightChannel(), {}
    try:
        receive_until_it_ends(channel, ticket)  # round 5 of the dead learner: failed
        waiting = threading.Thread(
            target=lambda: result.setdefault("ticket", subscription.wait_round(-1, 20.0, ticket))
        )
        waiting.start()
        deadline = time.monotonic() + 15
        while not second.members() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the subscription registered with the new store
        sending = threading.Thread(target=second.broadcast, args=(VERSION, [("w", torch.ones(3))]))
        sending.start()
        waiting.join(timeout=20)
        fresh = result["ticket"]
        got = dict(channel.receive(fresh))
        sending.join()
    finally:
        channel.shutdown()
        second.close()
    assert fresh.version == VERSION and fresh.store_id == second.store_id != ticket.store_id
    assert torch.equal(got["w"], torch.ones(3))


# ---- who missed a round: the subscription's and the sender's view ---------------------------


def test_a_member_registered_after_a_round_knows_it_missed_it_and_the_sender_too():
    sender = WeightSender(WeightSyncConfig(store_port=0, join_timeout_s=2.0))
    try:
        early = WeightSubscription("127.0.0.1", sender.config.store_port)
        thread = threading.Thread(target=sender.broadcast, args=(1, [("w", torch.ones(2))]))
        thread.start()
        ticket, channel = early.wait_round(-1, 15.0), WeightChannel()
        dict(channel.receive(ticket))
        thread.join()
        channel.shutdown()
        assert not sender.members_behind()  # everyone registered got v1
        late = WeightSubscription("127.0.0.1", sender.config.store_port)
        assert late.missed_version == -1
        assert late.wait_round(-1, 0.3) is None  # round 1 went out without it
        assert late.missed_version == 1 and early.missed_version == -1
        assert sender.members_behind()  # only a snapshot brings v1 to it now
    finally:
        sender.close()
