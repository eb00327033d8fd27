"""The weights log (weights/formats/delta_log.py): versions written as delta files against the one
before, replayed onto a keyframe bit for bit, and every break in the chain refused."""

from __future__ import annotations

import pytest
import torch

from weights.formats.delta_log import DeltaFile, DeltaLogWriter, delta_name, delta_version, replay
from weights.shared.delta import DeltaMismatch, crc_of


def _versions(count: int, dtype=torch.bfloat16) -> list[dict[str, torch.Tensor]]:
    """`count` versions of a small model in which a few values move each step, as at an RL
    learning rate in bf16."""
    gen = torch.Generator().manual_seed(0)
    master = {"embed.weight": torch.randn(64, 16, generator=gen), "norm": torch.ones(16)}
    versions = []
    for _ in range(count):
        versions.append({name: t.to(dtype) for name, t in master.items()})
        for t in master.values():
            t.add_(torch.randn(t.shape, generator=gen) * 1e-3)
    return versions


def _write(directory, versions) -> DeltaLogWriter:
    writer = DeltaLogWriter(directory)
    for version, named in enumerate(versions):
        for _ in writer.tee(version, named.items()):
            pass
    return writer


def _replayed(base: dict, paths) -> dict[str, torch.Tensor]:
    deltas = [DeltaFile(p) for p in paths]
    try:
        return {name: t for name, t, _ in replay(base.items(), None, deltas)}
    finally:
        for d in deltas:
            d.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_keyframe_and_its_deltas_give_every_version_bit_for_bit(tmp_path, dtype):
    versions = _versions(6, dtype)
    writer = _write(tmp_path, versions)
    assert writer.version == 5
    assert sorted(delta_version(p.name) for p in tmp_path.glob("*.delta")) == [1, 2, 3, 4, 5]
    for target in range(1, 6):
        paths = [tmp_path / delta_name(v) for v in range(1, target + 1)]
        rebuilt = _replayed(versions[0], paths)
        for name, tensor in versions[target].items():
            assert torch.equal(rebuilt[name].view(torch.uint8), tensor.view(torch.uint8))
    # From a later keyframe too: v3 + deltas 4, 5 = v5.
    rebuilt = _replayed(versions[3], [tmp_path / delta_name(v) for v in (4, 5)])
    assert all(torch.equal(rebuilt[n], t) for n, t in versions[5].items())


def test_a_bf16_delta_at_rl_rates_is_a_small_part_of_the_version(tmp_path):
    versions = _versions(3)
    _write(tmp_path, versions)
    whole = sum(t.numel() * t.element_size() for t in versions[2].values())
    header = DeltaFile(tmp_path / delta_name(2)).header
    assert header.base == 1 and header.version == 2
    assert header.num_bytes < whole


def test_a_missing_delta_is_refused_before_anything_is_decoded(tmp_path):
    versions = _versions(4)
    _write(tmp_path, versions)
    with pytest.raises(DeltaMismatch, match="follows v2, not v1"):
        _replayed(versions[0], [tmp_path / delta_name(1), tmp_path / delta_name(3)])
    # Applied to the wrong base, the first decode's CRC refuses it.
    with pytest.raises(DeltaMismatch):
        _replayed(versions[0], [tmp_path / delta_name(2)])


def test_a_base_of_another_history_is_refused_by_its_fingerprint(tmp_path):
    versions = _versions(3)
    _write(tmp_path, versions)
    other = {n: t + 1 for n, t in versions[1].items()}
    crcs = {n: crc_of(t) for n, t in other.items()}
    delta = DeltaFile(tmp_path / delta_name(2))
    with pytest.raises(DeltaMismatch, match="another history"):
        list(replay(other.items(), crcs, [delta]))
    right = {n: crc_of(t) for n, t in versions[1].items()}
    out = {n: t for n, t, _ in replay(versions[1].items(), right, [delta])}
    assert all(torch.equal(out[n], t) for n, t in versions[2].items())


def test_a_truncated_or_foreign_file_is_a_mismatch(tmp_path):
    _write(tmp_path, _versions(2))
    path = tmp_path / delta_name(1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DeltaMismatch):
        DeltaFile(path)
    path.write_bytes(b"not a delta at all")
    with pytest.raises(DeltaMismatch):
        DeltaFile(path)


def test_a_changed_layout_writes_no_delta_and_a_failed_stream_forgets(tmp_path):
    versions = _versions(2)
    writer = _write(tmp_path, versions[:1])
    grown = {**versions[1], "extra": torch.zeros(3, dtype=torch.bfloat16)}
    for _ in writer.tee(1, grown.items()):
        pass
    assert not list(tmp_path.glob("*.delta")) and writer.version == 1

    def broken():
        yield "embed.weight", versions[1]["embed.weight"]
        raise RuntimeError("the gather failed")

    with pytest.raises(RuntimeError):
        list(writer.tee(2, broken()))
    assert writer.version is None and not list(tmp_path.glob("*"))


def test_prune_keeps_only_the_current_chain(tmp_path):
    writer = _write(tmp_path, _versions(6))
    writer.prune(through=2, above=4)
    assert sorted(delta_version(p.name) for p in tmp_path.glob("*.delta")) == [3, 4]
