"""Weight broadcast rounds: bucket packing by hand, group membership worked out by hand,
and real gloo groups between processes (receivers are separate Python processes following
every round like an engine, the sender this one): a group that lives across rounds, a
receiver that joins at the next version, receivers that die or hang mid-round and are
dropped while the learner carries on, and receivers that never show up."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from weights.actor_side.subscription import WeightDtypeMismatch, WeightSubscription
from weights.config import WeightSyncConfig
from weights.engine_side.receiver import WeightChannel, _why_stop, receive_round
from weights.learner_side.sender import WeightSender
from weights.shared.buckets import bucketize, pack_bucket, unpack_bucket
from weights.shared.collective import BucketBuffers, receive_buckets
from weights.shared.communicator import RoundAbandoned, WeightGroup
from weights.shared.membership import Roster, next_roster, without
from weights.shared.protocol import RoundTicket
from weights.shared.rendezvous import connect_store, round_key
from weights.shared.tensors import checksum, tied_aliases, with_aliases

REPO = Path(__file__).resolve().parents[2]
RECEIVER = Path(__file__).with_name("receiver_process.py")


def _config(**overrides) -> WeightSyncConfig:
    return WeightSyncConfig(
        store_port=0, **{"join_timeout_s": 2.0, "transfer_timeout_s": 3.0, **overrides}
    )


def _subscribe(config: WeightSyncConfig, **kwargs) -> WeightSubscription:
    return WeightSubscription(config.store_host, config.store_port, **kwargs)


@pytest.fixture
def sender():
    sender = WeightSender(_config())
    yield sender
    sender.close()


def _start_receiver(config: WeightSyncConfig, rounds: int = 1, *fault: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(RECEIVER), f"{config.store_host}:{config.store_port}", str(rounds),
         *fault],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _lines(proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _in_thread(fn, *args):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn(*args)))
    thread.start()
    return thread, result


def _weights(count: int, *, value: float = 1.0, numel: int = 256) -> list[tuple[str, torch.Tensor]]:
    return [(f"w{i}", torch.full((numel,), value + i)) for i in range(count)]


# ---- buckets ------------------------------------------------------------------------------------


def test_bucketize_packs_by_aligned_bytes_and_gives_big_tensors_their_own_bucket():
    # 10 f32 = 40 B -> 64 aligned; 20 f32 = 80 B -> 128; 100 f32 = 400 B -> 448.
    a, b, c, d = torch.zeros(10), torch.zeros(20), torch.zeros(100), torch.zeros(10)
    buckets = list(bucketize([("a", a), ("b", b), ("c", c), ("d", d)], bucket_bytes=200))
    assert [[name for name, _ in bucket] for bucket in buckets] == [["a", "b"], ["c"], ["d"]]
    with pytest.raises(ValueError):
        list(bucketize([("a", a)], bucket_bytes=0))


def test_pack_places_tensors_at_64_byte_offsets_and_unpack_restores_them():
    tensors = [
        ("w", torch.arange(15, dtype=torch.float32).reshape(3, 5)),  # 60 B at 0
        ("h", torch.arange(7).to(torch.bfloat16)),  # 14 B at 64
        ("step", torch.tensor(42, dtype=torch.int64)),  # 8 B at 128, 0-dim
    ]
    header, buffer = pack_bucket(tensors)
    assert [entry[3] for entry in json.loads(header)] == [0, 64, 128]
    assert buffer.dtype == torch.uint8 and buffer.numel() == 192
    restored = unpack_bucket(header, buffer)
    for (name, tensor), (got_name, got) in zip(tensors, restored, strict=True):
        assert got_name == name and got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got, tensor)


def test_a_sender_packs_into_its_own_buffer_and_a_lone_tensor_goes_uncopied():
    tensors = [("a", torch.full((3,), 1.0)), ("b", torch.full((5,), 2.0))]
    into = torch.full((1024,), 7, dtype=torch.uint8)  # stale bytes from an earlier bucket
    header, buffer = pack_bucket(tensors, into=into)
    assert buffer.data_ptr() == into.data_ptr() and buffer.numel() == 128
    assert not buffer[12:64].any() and not buffer[84:].any()  # padding zeroed, not stale
    for (_, got), (_, tensor) in zip(unpack_bucket(header, buffer), tensors, strict=True):
        assert torch.equal(got, tensor)
    lone = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    header, buffer = pack_bucket([("lone", lone)], into=into)
    assert buffer.data_ptr() == lone.data_ptr()  # its own memory
    assert torch.equal(unpack_bucket(header, buffer)[0][1], lone)
    header, buffer = pack_bucket([("t", lone.T)])  # not contiguous: copied
    assert buffer.data_ptr() != lone.data_ptr()
    assert torch.equal(unpack_bucket(header, buffer)[0][1], lone.T)


def test_a_receiver_reuses_a_bucket_buffer_only_once_nobody_holds_its_tensors():
    spare = BucketBuffers("cpu")
    first = spare.take(100)
    view = first[10:20]  # a consumer still holds a tensor of that bucket
    del first
    second = spare.take(100)
    assert second.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()  # new
    del view, second
    kept = {buffer.untyped_storage().data_ptr() for buffer in spare.kept}
    reused = spare.take(80)  # free again: reused, no new buffer
    assert reused.numel() == 80 and reused.untyped_storage().data_ptr() in kept
    assert len(spare.kept) == 2
    held = [reused, spare.take(100)]
    spare.take(300)  # both held: a new one, kept in place of the smallest
    assert len(spare.kept) == BucketBuffers.MAX_KEPT and held


def test_ranks_follow_member_ids_with_each_members_slots():
    # Sender is rank 0; member 2 (1 worker) -> 1; member 5 (TP=2) -> 2, 3; member 9 -> 4.
    roster = Roster(group_id=0, slots={9: 1, 2: 1, 5: 2}, backend="gloo")
    assert roster.ranks == {2: 1, 5: 2, 9: 4} and roster.world_size == 5
    assert Roster.from_json(json.loads(json.dumps(roster.as_json()))) == roster


def test_a_group_lives_while_its_membership_does():
    current = Roster(group_id=3, slots={1: 1, 2: 2}, backend="nccl")
    kept = next_roster(current, {1: 1, 2: 2}, broken=False, next_id=4, backend="nccl")
    assert kept is current  # same members, last round fine: the same communicator
    joined = next_roster(current, {1: 1, 2: 2, 7: 1}, broken=False, next_id=4, backend="nccl")
    assert joined.group_id == 4 and joined.ranks == {1: 1, 2: 2, 7: 4}  # a member came
    gone = next_roster(current, {2: 2}, broken=False, next_id=4, backend="nccl")
    assert gone.group_id == 4 and gone.ranks == {2: 1}  # a member left or was evicted
    after_failure = next_roster(current, {1: 1, 2: 2}, broken=True, next_id=4, backend="nccl")
    assert after_failure.group_id == 4 and after_failure.slots == current.slots
    assert next_roster(current, {}, broken=False, next_id=4, backend="nccl") is None
    assert next_roster(None, {5: 1}, broken=False, next_id=0, backend="gloo").ranks == {5: 1}
    with pytest.raises(ValueError):
        next_roster(None, {1: 0}, broken=False, next_id=0, backend="gloo")


def test_absent_members_are_dropped_into_a_new_group():
    roster = Roster(group_id=3, slots={1: 1, 2: 2, 4: 1}, backend="gloo")
    smaller = without(roster, {2}, next_id=5)
    assert smaller.group_id == 5 and smaller.ranks == {1: 1, 4: 2} and smaller.world_size == 3
    assert without(roster, {1, 2, 4}, next_id=5) is None


def test_config_rejects_bad_values():
    with pytest.raises(ValueError):
        WeightSyncConfig(bucket_mb=0)
    with pytest.raises(ValueError):
        WeightSyncConfig(backend="mpi")


def test_tied_parameters_are_loaded_under_every_name():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(4, 2)
            self.head = torch.nn.Linear(2, 4, bias=False)
            self.head.weight = self.embed.weight

    aliases = tied_aliases(Tied())
    assert aliases == {"embed.weight": ["head.weight"]}
    embed, stale_head, other = torch.ones(4, 2), torch.zeros(4, 2), torch.ones(3)
    out = list(
        with_aliases([("embed.weight", embed), ("head.weight", stale_head), ("x", other)], aliases)
    )
    assert [name for name, _ in out] == ["embed.weight", "head.weight", "x"]
    assert out[1][1] is embed  # the head gets the embedding's tensor, the incoming one dropped


def test_checksum_is_order_independent_and_counts():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([[3.0]], dtype=torch.float64)
    expected = {"sum": 6.0, "sum_sq": 14.0, "num_tensors": 2, "num_elements": 3, "num_bytes": 16}
    assert checksum([("a", a), ("b", b)]) == expected == checksum([("b", b), ("a", a)])


# ---- rounds between processes --------------------------------------------------------------------


def test_broadcast_reaches_two_receiver_processes_bit_exact():
    sender = WeightSender(_config(bucket_mb=4.0, join_timeout_s=30.0, transfer_timeout_s=60.0))
    generator = torch.Generator().manual_seed(0)
    weights = {
        f"layers.{i}.weight": torch.randn(512, 1024, generator=generator) for i in range(8)
    }  # 8 x 2 MiB = 16 MiB
    weights["norm.weight"] = torch.randn(1024, generator=generator).to(torch.bfloat16)
    receivers = [_start_receiver(sender.config) for _ in range(2)]
    try:
        report = sender.broadcast(1, weights.items())
        outputs = [_lines(proc)[-1] for proc in receivers]
    finally:
        for proc in receivers:
            proc.kill()
        sender.close()
    assert report.ok and report.num_receivers == 2 and report.num_tensors == 9
    assert sorted(out["rank"] for out in outputs) == [1, 2]
    assert all(out["world"] == 3 for out in outputs)
    expected = checksum(weights.items())
    for out in outputs:
        assert out["names"] == list(weights)
        assert out["checksum"] == expected  # bit-exact: same float64 sums
    print(
        f"\nbroadcast 16 MiB to 2 processes: {report.mb_per_s:.0f} MB/s "
        f"(join {report.join_s * 1e3:.0f} ms, transfer {report.transfer_s * 1e3:.0f} ms)"
    )


def _until_members(sender: WeightSender, count: int) -> None:
    for _ in range(400):
        if sum(state == "alive" for state in sender.members().values()) >= count:
            return
        time.sleep(0.025)
    raise AssertionError(f"fewer than {count} members registered")


def test_the_group_lives_across_rounds_and_a_newcomer_joins_at_the_next_version(sender):
    first = _start_receiver(sender.config, 3)
    try:
        _until_members(sender, 1)
        one = sender.broadcast(1, _weights(3, value=1.0))
        two = sender.broadcast(2, _weights(3, value=2.0))
        second = _start_receiver(sender.config, 1)
        _until_members(sender, 2)
        three = sender.broadcast(3, _weights(3, value=3.0))
        first_lines, second_lines = _lines(first), _lines(second)
    finally:
        first.kill()
    assert one.ok and one.new_group and one.num_receivers == 1
    assert two.ok and not two.new_group and two.group_id == one.group_id  # same communicator
    assert three.ok and three.new_group and three.num_receivers == 2  # the newcomer joined v3
    assert [line["version"] for line in first_lines] == [1, 2, 3]
    assert [line["group"] for line in first_lines] == [one.group_id] * 2 + [three.group_id]
    assert second_lines == [second_lines[0]] and second_lines[0]["version"] == 3
    assert second_lines[0]["checksum"] == checksum(_weights(3, value=3.0))


@pytest.mark.parametrize("fault", ["die", "hang"])
def test_a_receiver_lost_mid_round_fails_that_round_and_is_dropped(sender, fault):
    """One of two receivers dies (or hangs) after the first tensor of round 2 arrived. That
    round fails within the transfer timeout; the learner carries on; round 3 drops the lost
    receiver after one join timeout and reaches the other, on a fresh group."""
    lost = _start_receiver(sender.config, 3, fault, "2")
    survivor = _start_receiver(sender.config, 3, "--until", "3")
    try:
        _until_members(sender, 2)
        one = sender.broadcast(1, _weights(4, value=1.0))
        started = time.monotonic()
        two = sender.broadcast(2, _weights(4, value=2.0))  # 1 KiB tensors: a bucket each
        two_s = time.monotonic() - started
        three = sender.broadcast(3, _weights(4, value=3.0))
        survivor_lines = _lines(survivor)
    finally:
        lost.kill()
        survivor.kill()
    assert one.ok and one.num_receivers == 2
    assert not two.ok and two_s < 2.0 + 3.0 + 3.0 + 2.0  # join + a bucket + the acks, slack
    lost_id = three.missed[0]
    assert three.ok and three.missed == (lost_id,) and three.num_receivers == 1
    assert sender.members()[lost_id] == "evicted"
    versions = [line["version"] for line in survivor_lines if "error" not in line]
    # Round 2 may have reached the survivor whole before the lost one broke it: either way
    # the survivor ends on version 3.
    assert versions in ([1, 3], [1, 2, 3])
    assert survivor_lines[-1]["checksum"] == checksum(_weights(4, value=3.0))
    print(f"\n{fault}: round 2 failed after {two_s:.1f}s; round 3 dropped member {lost_id}")


def test_a_waiting_receiver_stops_within_moments_once_its_sender_gives_the_round_up():
    """A receiver waits for a bucket its sender will never send; the sender's group stays
    open (a peer that hung keeps it closing), so no connection error tells the receiver
    anything. Once round 1 is marked given up in the store, the receiver stops within
    PEER_CHECK_S, not after its 20 s timeout: in time for the next round's join window."""
    server = connect_store("127.0.0.1", 0, is_master=True, timeout_s=20.0)
    client = connect_store("127.0.0.1", server.port, is_master=False, timeout_s=20.0)
    groups: dict[int, WeightGroup] = {}

    def form(rank, store, why_stop=None):
        groups[rank] = WeightGroup(store, "127.0.0.1", 0, rank, 2, "gloo", 20.0, why_stop)

    sender_thread, _ = _in_thread(form, 0, server)
    form(1, client, lambda: _why_stop(client, 1))
    sender_thread.join(timeout=20)
    receiving, result = _in_thread(_receive_timed, groups[1])
    time.sleep(0.3)
    assert receiving.is_alive()  # nothing was sent, nothing failed
    server.set(round_key(1, "failed"), "a shard's all-gather failed")
    receiving.join(timeout=20)
    groups[0].abort()
    error, waited_s = result["value"]
    assert isinstance(error, RoundAbandoned) and "the sender failed round 1" in str(error)
    assert waited_s < 10.0  # PEER_CHECK_S is 0.5 s; the timeout it no longer waits is 20 s
    assert _why_stop(client, 2) is None  # a round nobody gave up


def _receive_timed(group: WeightGroup) -> tuple[Exception | None, float]:
    started = time.monotonic()
    try:
        list(receive_buckets(group))
    except RuntimeError as e:
        return e, time.monotonic() - started
    return None, time.monotonic() - started


def test_a_round_the_sender_gives_up_is_marked_and_the_receiver_takes_the_next(sender):
    """The learner's side of round 1 fails mid-round (its tensors' source raised): the
    round is marked given up in the store, with its error, and the receiver takes round 2
    whole."""
    subscription = _subscribe(sender.config)
    channel = WeightChannel()

    def failing_source():
        yield "w0", torch.ones(256)
        raise RuntimeError("a shard's all-gather failed")

    def receive(ticket):
        with contextlib.suppress(RuntimeError):
            return list(channel.receive(ticket))

    try:
        thread, ticket = _in_thread(subscription.wait_round, -1, 30.0)
        sender_thread, one = _in_thread(sender.broadcast, 1, failing_source())
        receive(_wait(thread, ticket))
        sender_thread.join(timeout=30)
        marked = channel._store.get(round_key(1, "failed")).decode()  # until round 2 ends
        thread, ticket = _in_thread(subscription.wait_round, 1, 30.0)
        sender_thread, two = _in_thread(sender.broadcast, 2, _weights(2, value=2.0))
        got = receive(_wait(thread, ticket))
        sender_thread.join(timeout=30)
    finally:
        channel.close()
    assert not one["value"].ok and marked == one["value"].error == "a shard's all-gather failed"
    assert two["value"].ok and two["value"].num_receivers == 1
    assert checksum(got) == checksum(_weights(2, value=2.0))


def test_registered_member_that_never_gets_ready_costs_one_join_timeout(sender):
    dead = _subscribe(sender.config)  # registers, then never calls wait_round
    started = time.monotonic()
    report = sender.broadcast(1, [("w", torch.ones(4))])
    first_s = time.monotonic() - started
    assert report.ok and report.num_receivers == 0 and report.missed == (dead.member_id,)
    assert 2.0 <= first_s < 3.0  # join_timeout_s = 2
    started = time.monotonic()
    report = sender.broadcast(2, [("w", torch.ones(4))])
    assert report.missed == () and time.monotonic() - started < 0.5  # evicted: not awaited


def test_receiver_that_missed_a_round_takes_the_next(sender):
    assert sender.broadcast(1, [("w", torch.zeros(3))]).num_receivers == 0  # nobody there
    late = _subscribe(sender.config)
    thread, ticket = _in_thread(late.wait_round, -1, 10.0)  # round 1 has no seat for it
    time.sleep(0.3)
    report_thread, report = _in_thread(sender.broadcast, 2, [("w", torch.full((3,), 2.0))])
    got = dict(receive_round(_wait(thread, ticket)))
    report_thread.join()
    assert report["value"].ok and ticket["value"].version == 2
    assert torch.equal(got["w"], torch.full((3,), 2.0))


def test_an_engine_of_another_dtype_is_refused_when_it_subscribes():
    sender = WeightSender(_config(), dtype="bfloat16")
    try:
        with pytest.raises(WeightDtypeMismatch, match='actor.engine.dtype = "bfloat16"'):
            _subscribe(sender.config, dtype="float32")
        assert _subscribe(sender.config, dtype="bfloat16").member_id >= 1
    finally:
        sender.close()


def test_wait_round_gives_up_when_no_round_comes(sender):
    sub = _subscribe(sender.config)
    started = time.monotonic()
    assert sub.wait_round(-1, 0.5) is None
    assert time.monotonic() - started < 1.5


def test_leave_ends_a_waiting_subscription_at_once(sender):
    subscription = _subscribe(sender.config)
    thread, ticket = _in_thread(subscription.wait_round, -1, 30.0)
    time.sleep(0.2)
    started = time.monotonic()
    subscription.leave()  # from another thread, as the actor does when it stops
    thread.join(timeout=5.0)
    assert not thread.is_alive() and time.monotonic() - started < 1.0
    assert ticket["value"] is None and subscription.left
    assert sender.members() == {subscription.member_id: "left"}
    report = sender.broadcast(1, [("w", torch.ones(2))])  # nobody awaited, nobody seated
    assert report.ok and report.num_receivers == 0 and report.missed == ()
    assert report.join_s < 0.5


def test_member_that_leaves_after_being_seated_is_not_waited_for(sender):
    """A stopping actor's poll thread got a seat in round 1 and left before its workers got
    ready: the sender drops it as soon as it sees `left`, well before the join timeout."""
    leaving = _subscribe(sender.config)
    waiting, ticket = _in_thread(leaving.wait_round, -1, 30.0)
    broadcasting, report = _in_thread(sender.broadcast, 1, [("w", torch.ones(2))])
    waiting.join(timeout=5.0)
    assert ticket["value"] is not None and ticket["value"].version == 1
    leaving.leave()
    broadcasting.join(timeout=10.0)
    report = report["value"]
    assert report.ok and report.num_receivers == 0 and report.missed == (leaving.member_id,)
    assert report.join_s < 1.5 and report.transfer_s == 0.0  # no group was formed
    assert sender.members()[leaving.member_id] == "left"  # not turned into "evicted"


def test_sender_rejects_versions_that_do_not_increase(sender):
    sender.broadcast(3, [])
    with pytest.raises(ValueError):
        sender.broadcast(3, [])


def _wait(thread: threading.Thread, result: dict) -> RoundTicket:
    thread.join(timeout=15)
    assert result.get("value") is not None, "no ticket"
    return result["value"]


def test_subscription_reconnects_after_a_learner_restart():
    first = WeightSender(_config())
    config = first.config
    subscription = _subscribe(config)
    first.close()  # the learner goes away; its store with it
    thread, ticket = _in_thread(subscription.wait_round, -1, 30.0)
    time.sleep(1.0)
    second = WeightSender(config)  # restarted on the same port
    try:
        for _ in range(200):  # until the subscription registered with the new store
            if second.members():
                break
            time.sleep(0.05)
        report_thread, report = _in_thread(second.broadcast, 1, [("w", torch.ones(2))])
        got = dict(receive_round(_wait(thread, ticket)))
        report_thread.join()
    finally:
        second.close()
    assert report["value"].ok and torch.equal(got["w"], torch.ones(2))


def test_an_engines_channel_follows_a_learner_restarted_on_the_same_port():
    """An engine keeps one WeightChannel (store connection and group) across rounds. The
    learner dies and comes back on the same port at a lower version (resumed from a
    checkpoint): the channel's old connection is dead, so the first round of the new
    learner must go out on a new connection and a new group, not fail (each failed round
    cost the fault suite a transfer timeout per step)."""
    first = WeightSender(_config())
    config = first.config
    subscription, channel = _subscribe(config), WeightChannel()
    try:
        thread, ticket = _in_thread(subscription.wait_round, -1, 30.0)
        _until_members(first, 1)
        report_thread, report = _in_thread(first.broadcast, 5, [("w", torch.ones(2))])
        assert dict(channel.receive(_wait(thread, ticket)))["w"].sum() == 2
        report_thread.join()
        assert report["value"].ok
        first.close()  # the learner is killed; its store goes with it
        second = WeightSender(config)  # resumed on the same port, at version 4
        try:
            thread, ticket = _in_thread(subscription.wait_round, -1, 30.0)
            _until_members(second, 1)  # the subscription registered again
            report_thread, report = _in_thread(second.broadcast, 4, [("w", torch.full((2,), 4.0))])
            got = dict(channel.receive(_wait(thread, ticket)))
            report_thread.join()
        finally:
            second.close()
    finally:
        channel.shutdown()
    assert report["value"].ok and report["value"].num_receivers == 1
    assert torch.equal(got["w"], torch.full((2,), 4.0))


def test_sender_forgets_older_rounds(sender):
    for version in (1, 2, 3):
        sender.broadcast(version, [("w", torch.ones(1))])
    rounds = {key.split("/")[3] for key in sender._store.list_keys() if "/round/" in key}
    assert rounds == {"3"}


def test_a_lone_tensor_arrives_in_the_memory_the_receiver_offers(sender):
    """A vocabulary-sized tensor travels alone: a receiver that offers its own tensor of
    that dtype and shape (the engine's live embedding) gets the bytes there, no buffer; one
    offered in another shape, or a tensor sharing a bucket, arrives in a buffer as before."""
    embedding = torch.zeros(64, 32)  # the live parameter
    transposed = torch.zeros(32, 16)  # offered for "wide", which is (16, 32): refused
    offers = {"embed": embedding, "wide": transposed, "a": torch.zeros(5)}
    asked = []

    def destination(name, dtype, shape):
        asked.append(name)
        return offers.get(name)

    weights = [("embed", torch.randn(64, 32)), ("wide", torch.randn(16, 32)),
               ("a", torch.randn(5)), ("b", torch.randn(3))]  # fmt: skip
    subscription = _subscribe(sender.config)
    thread, ticket = _in_thread(subscription.wait_round, -1, 30.0)
    # 1 KiB buckets: "embed" (8 KiB) and "wide" (2 KiB) travel alone, "a" and "b" together.
    sender.config.bucket_mb = 1024 / 2**20
    report_thread, report = _in_thread(sender.broadcast, 1, weights)
    channel = WeightChannel()
    try:
        got = dict(channel.receive(_wait(thread, ticket), destination))
    finally:
        channel.close()
    report_thread.join(timeout=15)
    assert report["value"].ok
    assert asked == ["embed", "wide"]  # only a bucket of one tensor is offered anywhere
    assert got["embed"].data_ptr() == embedding.data_ptr()
    assert torch.equal(embedding, weights[0][1])
    for name, tensor in weights[1:]:
        assert torch.equal(got[name], tensor)
    assert got["wide"].data_ptr() != transposed.data_ptr() and not transposed.any()
    assert channel.wire_s > 0
