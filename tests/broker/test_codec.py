"""The packed-bytes codec: exact round trips, little-endian layout, clear decode errors."""

import msgspec
import numpy as np
import pytest

from broker.codec import (
    WireDecodeError,
    decode,
    encode,
    num_tokens,
    pack_tokens,
    token_arrays,
)
from broker.wire import PolicyVersion, PromptTask, Trajectory
from tests.broker.builders import prompt_task, trajectory


def test_trajectory_round_trip_is_exact():
    original = trajectory(num_tokens=1000, prompt_len=100, version=7, seed=3)
    decoded = decode(encode(original), Trajectory)
    assert decoded == original
    arrays = token_arrays(decoded)
    assert arrays.token_ids.dtype == np.int32 and arrays.logprobs.dtype == np.float32
    assert num_tokens(decoded) == 1000
    assert arrays.loss_mask[:100].sum() == 0 and arrays.loss_mask[100:].all()
    assert set(arrays.versions[100:].tolist()) == {7}
    assert set(arrays.versions[:100].tolist()) == {-1}


def test_token_bytes_are_little_endian_packed():
    packed = pack_tokens(
        token_ids=[1, 256], logprobs=[-0.5, 0.0], loss_mask=[0, 1], versions=[-1, 2]
    )
    assert packed["token_ids"] == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert packed["loss_mask"] == b"\x00\x01"
    assert packed["versions"] == b"\xff\xff\xff\xff\x02\x00\x00\x00"
    assert np.frombuffer(packed["logprobs"], "<f4").tolist() == [-0.5, 0.0]


def test_pack_rejects_unequal_lengths():
    with pytest.raises(ValueError, match="equal length"):
        pack_tokens(token_ids=[1, 2, 3], logprobs=[0.0], loss_mask=[1, 1, 1], versions=[0, 0, 0])


def test_arrays_travel_as_bytes_not_int_lists():
    # The point of the packed codec: 100K tokens encode to ~13 bytes each, not a msgpack list.
    encoded = encode(trajectory(num_tokens=100_000))
    assert 13 * 100_000 <= len(encoded) < 13 * 100_000 + 1024


def test_prompt_task_and_policy_version_round_trip():
    task = prompt_task(task_id="abc", step=3)
    assert decode(encode(task), PromptTask) == task
    version = PolicyVersion(version=5, published_at=1.5, snapshot_path="/w/5")
    assert decode(encode(version), PolicyVersion) == version


def test_truncated_message_names_itself():
    data = encode(trajectory(trajectory_id="t-42"))
    with pytest.raises(WireDecodeError, match=r"Trajectory \(seq 9\)"):
        decode(data[: len(data) // 2], Trajectory, what="(seq 9)")


def test_garbage_is_a_decode_error():
    with pytest.raises(WireDecodeError):
        decode(b"\x00\x01garbage", Trajectory)


def test_misaligned_arrays_are_rejected_with_the_trajectory_id():
    good = trajectory(trajectory_id="t-7", num_tokens=10, prompt_len=2)
    bad = msgspec.structs.replace(good, logprobs=good.logprobs[:-4])
    with pytest.raises(WireDecodeError, match="'t-7'.*logprobs has 36 bytes for 10 tokens"):
        decode(encode(bad), Trajectory)
    bad_prompt = msgspec.structs.replace(good, prompt_len=11)
    with pytest.raises(WireDecodeError, match="prompt_len 11"):
        decode(encode(bad_prompt), Trajectory)


def test_wrong_field_type_is_a_decode_error():
    data = msgspec.msgpack.encode({"trajectory_id": 5})
    with pytest.raises(WireDecodeError, match="cannot decode Trajectory"):
        decode(data, Trajectory)
