"""The delta codec (weights/shared/delta.py): every encoding decodes to the sender's tensor bit for
bit, along a chain of versions too; a receiver that missed a delta is told, not fed wrong
weights; a delta of few changes is a small fraction of the tensor."""

from __future__ import annotations

import pytest
import torch

from weights.shared.delta import DeltaMismatch, bits, decode, encode


def _versions(n: int, *, shape=(256, 384), lr=1e-4, seed=0) -> list[torch.Tensor]:
    """fp32 master weights moved by about `lr` a step, as the bf16 versions a learner sends."""
    generator = torch.Generator().manual_seed(seed)
    master = torch.randn(shape, generator=generator) * 0.02
    out = []
    for _ in range(n):
        out.append(master.to(torch.bfloat16))
        master += lr * torch.randn(shape, generator=generator).sign()
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and (bits(a) == bits(b)).all()


@pytest.mark.parametrize("encoding", ["keyframe", "xor", "sparse"])
def test_every_encoding_decodes_bit_for_bit_along_a_chain(encoding):
    versions = _versions(12)
    held = decode(encode(versions[0], None), None, versions[0])
    for previous, current in zip(versions, versions[1:], strict=False):
        payload = encode(current, previous, encoding)
        held = decode(payload, held, current)
        assert _same_bits(held, current)


def test_special_values_keep_their_bits():
    before = torch.tensor([0.0, 1.0, -1.0, 2.0], dtype=torch.bfloat16)
    after = torch.tensor([-0.0, float("nan"), float("inf"), 2.0], dtype=torch.bfloat16)
    for encoding in ("xor", "sparse"):
        assert _same_bits(decode(encode(after, before, encoding), before, after), after)


@pytest.mark.parametrize("encoding", ["xor", "sparse"])
def test_a_receiver_that_missed_a_delta_is_told(encoding):
    v0, v1, v2 = _versions(3)
    with pytest.raises(DeltaMismatch, match="keyframe"):
        decode(encode(v2, v1, encoding), v0, v2)  # it still holds v0: v1's delta never came
    with pytest.raises(DeltaMismatch):
        decode(encode(v2, v1, encoding), None, v2)


def test_a_delta_of_few_changes_is_a_small_fraction_of_the_tensor():
    v0, v1 = _versions(2, lr=1e-6)  # a step of 1e-6 rarely moves a bf16 value of 0.02
    changed = float((bits(v0) != bits(v1)).mean())
    assert 0 < changed < 0.05
    full = v1.numel() * v1.element_size()
    for encoding in ("xor", "sparse"):
        assert encode(v1, v0, encoding).num_bytes < 0.15 * full
    assert encode(v1, None).num_bytes > 0.5 * full  # random weights do not compress


def test_a_delta_between_different_shapes_is_refused():
    with pytest.raises(ValueError, match="same shape"):
        encode(torch.zeros(4, dtype=torch.bfloat16), torch.zeros(5, dtype=torch.bfloat16))
