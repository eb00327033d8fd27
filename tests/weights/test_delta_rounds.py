"""Delta rounds (weights/shared/delta_book.py): the books on both sides through real buckets, then
real gloo rounds between processes with `weight_sync.delta`: every version arrives bit for
bit over a chain of deltas, keyframes come every K versions and with a new group, and a
receiver that missed a delta fails that round (never loads wrong weights) and is current
again after the next, a keyframe."""

from __future__ import annotations

import pytest
import torch

from tests.weights.test_rounds import _config, _lines, _start_receiver, _until_members
from weights.learner_side.sender import WeightSender
from weights.shared.buckets import Encoded, bucketize, pack_bucket, unpack_bucket
from weights.shared.delta import DeltaMismatch, bits
from weights.shared.delta_book import ReceiverBook, SenderBook
from weights.shared.tensors import checksum

SHAPES = {"embed": (512, 64), "layer.0.weight": (64, 64), "norm": (64,)}


def _versions(count: int, *, lr: float = 1e-4, seed: int = 0):
    """bf16 versions of fp32 master weights moved by about `lr` a step (as a learner sends)."""
    generator = torch.Generator().manual_seed(seed)
    masters = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
    out = []
    for _ in range(count):
        out.append({name: master.to(torch.bfloat16) for name, master in masters.items()})
        for master in masters.values():
            master += lr * torch.randn(master.shape, generator=generator).sign()
    return out


def _through_buckets(items):
    """What a receiver's channel gets: the items packed into buckets and unpacked."""
    for bucket in bucketize(items, bucket_bytes=16 * 1024):
        header, buffer = pack_bucket(bucket)
        yield from unpack_bucket(header, buffer)


def _round(sender: SenderBook, receiver: ReceiverBook, version: int, weights, *, same_group=True):
    base = sender.base_for(version, same_group=same_group)
    sent = list(sender.encode(weights.items(), version, base))
    got = {name: tensor.clone() for name, tensor in receiver.decode(_through_buckets(sent))}
    sender.commit(version, base)
    return base, got, sum(item.data.numel() for _, item in sent)


def _bit_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and (bits(a[n]) == bits(b[n])).all() for n in a
    )


def test_twenty_deltas_arrive_bit_for_bit_with_a_keyframe_every_k():
    versions = _versions(21)
    sender, receiver = SenderBook(keyframe_interval=8), ReceiverBook()
    raw = sum(t.numel() * t.element_size() for t in versions[0].values())
    keyframes, delta_bytes = [], []
    for version, weights in enumerate(versions):
        base, got, wire = _round(sender, receiver, version, weights)
        assert _bit_equal(got, weights), version
        assert receiver.version == version
        if base is None:
            keyframes.append(version)
            assert wire == raw  # a keyframe is the tensors' own bytes
        else:
            assert base == version - 1
            delta_bytes.append(wire)
    assert keyframes == [0, 8, 16]
    assert max(delta_bytes) < 0.5 * raw  # lr 1e-4 moves some bf16 values; most stay


def test_a_new_group_starts_with_a_keyframe_and_a_failed_round_too():
    versions = _versions(4)
    sender, receiver = SenderBook(keyframe_interval=100), ReceiverBook()
    assert _round(sender, receiver, 0, versions[0])[0] is None
    assert _round(sender, receiver, 1, versions[1])[0] == 0
    assert _round(sender, receiver, 2, versions[2], same_group=False)[0] is None
    sender.forget()  # the round failed: members may hold part of it
    base, got, _ = _round(sender, receiver, 3, versions[3])
    assert base is None and _bit_equal(got, versions[3])


def test_a_receiver_that_missed_a_delta_refuses_it_and_takes_the_next_keyframe():
    versions = _versions(4)
    sender, behind = SenderBook(keyframe_interval=100), ReceiverBook()
    _round(sender, behind, 0, versions[0])
    sent = list(sender.encode(versions[1].items(), 1, 0))  # `behind` never gets round 1
    sender.commit(1, 0)
    with pytest.raises(DeltaMismatch, match="missed a round"):
        dict(behind.decode(_through_buckets(list(sender.encode(versions[2].items(), 2, 1)))))
    assert behind.version is None and not behind.tensors  # nothing kept of a broken chain
    assert all(isinstance(item, Encoded) for _, item in sent)
    sender.forget()  # the sender saw that round fail
    base, got, _ = _round(sender, behind, 3, versions[3])
    assert base is None and _bit_equal(got, versions[3])


def test_plain_tensors_pass_through_a_receiver_book_untouched():
    weights = _versions(1)[0]
    got = dict(ReceiverBook().decode(_through_buckets(list(weights.items()))))
    assert _bit_equal(got, weights)


def _delta_sender(**overrides) -> WeightSender:
    return WeightSender(_config(**{"delta": True, "keyframe_interval": 4, **overrides}))


def test_delta_rounds_to_a_receiver_process_are_bit_exact_and_small():
    sender = _delta_sender()
    versions = _versions(7, lr=1e-5)
    receiver = _start_receiver(sender.config, len(versions))
    try:
        _until_members(sender, 1)
        reports = [sender.broadcast(v + 1, w.items()) for v, w in enumerate(versions)]
        lines = _lines(receiver)
    finally:
        receiver.kill()
        sender.close()
    assert all(report.ok for report in reports)
    assert [r.keyframe for r in reports] == [True, False, False, False, True, False, False]
    for report in reports:
        assert report.raw_bytes == sum(t.numel() * 2 for t in versions[0].values())
        assert (report.num_bytes < 0.25 * report.raw_bytes) != report.keyframe
    assert [line["version"] for line in lines] == list(range(1, 8))
    for line, weights in zip(lines, versions, strict=True):
        assert line["checksum"] == checksum(weights.items())
    ratios = [round(r.num_bytes / r.raw_bytes, 3) for r in reports]
    print(f"\ndelta rounds, bytes over raw: {ratios}")


def test_a_receiver_that_missed_a_delta_fails_that_round_then_takes_a_keyframe():
    """Of two receivers, one loses round 2 (its book goes back a version, as if it had
    missed it). Round 3, a delta, fails: that receiver refuses it before loading anything,
    the sender's round fails. Round 4 goes out as a keyframe on a new group and both
    receivers hold it bit for bit."""
    # The steady receiver learns of round 3's failure only when its transfer times out (3 s)
    # and then asks for a seat again: round 4 waits for it that long, where the tests' 2 s
    # join timeout let a loaded machine send round 4 without it (it then waited for a
    # version that never came).
    sender = _delta_sender(keyframe_interval=100, join_timeout_s=15.0)
    versions = _versions(4, lr=1e-5)
    lossy = _start_receiver(sender.config, 3, "lose", "2")
    # Round 3 may reach the steady receiver whole before the lossy one breaks it, or not:
    # either way it ends on version 4.
    steady = _start_receiver(sender.config, 4, "--until", "4")
    try:
        _until_members(sender, 2)
        reports = [sender.broadcast(v + 1, w.items()) for v, w in enumerate(versions)]
        lossy_lines, steady_lines = _lines(lossy), _lines(steady)
    finally:
        lossy.kill()
        steady.kill()
        sender.close()
    one, two, three, four = reports
    assert one.ok and one.keyframe and two.ok and not two.keyframe
    assert not three.ok and not three.keyframe
    assert four.ok and four.keyframe and four.num_receivers == 2
    refused = [line for line in lossy_lines if "error" in line]
    assert [line["version"] for line in refused] == [3]
    assert "missed a round" in refused[0]["error"]
    expected = checksum(versions[3].items())
    assert lossy_lines[-1]["version"] == 4 and lossy_lines[-1]["checksum"] == expected
    assert steady_lines[-1]["version"] == 4 and steady_lines[-1]["checksum"] == expected
