"""Weight broadcast rounds: bucket packing by hand, and real gloo groups between processes
(receivers are separate Python processes, the sender this one), including receivers that
never show up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from weights.buckets import bucketize, pack_bucket, unpack_bucket
from weights.config import WeightSyncConfig
from weights.receiver import receive_round
from weights.rendezvous import assign_ranks
from weights.sender import WeightSender
from weights.subscription import RoundTicket, WeightSubscription
from weights.vllm_worker import checksum, tied_aliases, with_aliases

REPO = Path(__file__).resolve().parents[2]

# A receiver process: registers, prints "ready", joins the first round, prints a checksum.
RECEIVER = """
import json, sys
from weights.receiver import receive_round
from weights.subscription import WeightSubscription
from weights.vllm_worker import checksum
host, port = sys.argv[1].rsplit(":", 1)
sub = WeightSubscription(host, int(port))
print("ready", flush=True)
ticket = sub.wait_round(-1, 60)
weights = [(name, tensor.clone()) for name, tensor in receive_round(ticket)]
print(json.dumps({"rank": ticket.base_rank, "world": ticket.world_size,
                  "names": [n for n, _ in weights], "checksum": checksum(weights)}), flush=True)
"""


def _config(**overrides) -> WeightSyncConfig:
    return WeightSyncConfig(
        store_port=0, **{"join_timeout_s": 2.0, "transfer_timeout_s": 3.0, **overrides}
    )


def _subscribe(config: WeightSyncConfig) -> WeightSubscription:
    return WeightSubscription(config.store_host, config.store_port)


@pytest.fixture
def sender():
    sender = WeightSender(_config())
    yield sender
    sender.close()


def _start_receiver(config: WeightSyncConfig) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, f"{config.store_host}:{config.store_port}"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _in_thread(fn, *args):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn(*args)))
    thread.start()
    return thread, result


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


def test_ranks_follow_member_ids_with_each_members_slots():
    # Sender is rank 0; member 2 (1 worker) -> 1; member 5 (TP=2) -> 2, 3; member 9 -> 4.
    assert assign_ranks({9: 1, 2: 1, 5: 2}) == ({"2": 1, "5": 2, "9": 4}, 5)
    assert assign_ranks({}) == ({}, 1)
    with pytest.raises(ValueError):
        assign_ranks({1: 0})


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
        outputs = [json.loads(proc.communicate(timeout=60)[0]) for proc in receivers]
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


def test_registered_member_that_never_joins_costs_one_join_timeout(sender):
    dead = _subscribe(sender.config)  # registers, then never calls wait_round
    started = time.monotonic()
    report = sender.broadcast(1, [("w", torch.ones(4))])
    first_s = time.monotonic() - started
    assert report.ok and report.num_receivers == 0 and report.missed == (dead.member_id,)
    assert 2.0 <= first_s < 3.0  # join_timeout_s = 2
    started = time.monotonic()
    report = sender.broadcast(2, [("w", torch.ones(4))])
    assert report.missed == () and time.monotonic() - started < 0.5  # evicted: not awaited


def test_member_that_joins_but_never_connects_fails_the_round_within_timeout(sender):
    silent = _subscribe(sender.config)
    thread, ticket = _in_thread(silent.wait_round, -1, 10.0)  # joins, never receives
    num_pulled = 0

    def weights():
        nonlocal num_pulled
        for i in range(5):
            num_pulled += 1
            yield f"w{i}", torch.ones(4)

    started = time.monotonic()
    report = sender.broadcast(1, weights())
    elapsed = time.monotonic() - started
    thread.join()
    assert ticket["value"].version == 1
    assert not report.ok and report.num_receivers == 1
    assert elapsed < 2.0 + 3.0 + 1.0  # join + transfer timeouts, with slack
    assert num_pulled == 5  # drained: FSDP ranks gathering in lockstep are not left hanging


def test_receiver_that_missed_a_round_takes_the_next(sender):
    assert sender.broadcast(1, [("w", torch.zeros(3))]).num_receivers == 0  # nobody there
    late = _subscribe(sender.config)
    thread, ticket = _in_thread(late.wait_round, -1, 10.0)  # sees round 1: closed, skips it
    time.sleep(0.3)
    report_thread, report = _in_thread(sender.broadcast, 2, [("w", torch.full((3,), 2.0))])
    got = dict(receive_round(_wait(thread, ticket)))
    report_thread.join()
    assert report["value"].ok and ticket["value"].version == 2
    assert torch.equal(got["w"], torch.full((3,), 2.0))


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


def test_member_that_leaves_after_joining_gets_no_seat(sender):
    """A stopping actor's poll thread joined round 1 and left before the roster: seating it
    would fail the round for everyone after transfer_timeout_s."""
    leaving = _subscribe(sender.config)
    slow = _subscribe(sender.config)  # never joins: the sender waits join_timeout_s
    waiting, ticket = _in_thread(leaving.wait_round, -1, 30.0)
    broadcasting, report = _in_thread(sender.broadcast, 1, [("w", torch.ones(2))])
    time.sleep(0.5)  # `leaving` joined round 1 and polls for its roster
    leaving.leave()
    waiting.join(timeout=1.0)
    assert not waiting.is_alive() and ticket["value"] is None
    broadcasting.join(timeout=10.0)
    report = report["value"]
    assert report.ok and report.num_receivers == 0 and report.missed == (slow.member_id,)
    assert report.transfer_s == 0.0  # no group was formed


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


def test_sender_forgets_older_rounds(sender):
    for version in (1, 2, 3):
        sender.broadcast(version, [("w", torch.ones(1))])
    rounds = {key.split("/")[3] for key in sender._store.list_keys() if "/round/" in key}
    assert rounds == {"3"}
