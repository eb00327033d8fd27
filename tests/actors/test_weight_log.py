"""A replica that does not follow the broadcast rebuilds announced versions from the newest
snapshot plus the weights log (actors/weight_log.py): bit for bit, from its own previous
rebuild when that is of the announced history, from the snapshot when not, and from the
snapshot alone when the log cannot take it further. Real files, as the learner writes them
(weights/formats/delta_log.py, weights/formats/snapshot.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from actors.snapshots import SnapshotSource
from actors.weight_log import WeightLogReader
from broker.wire import PolicyVersion
from learner.artifacts import open_artifacts
from weights.formats.delta_log import DeltaLogWriter
from weights.formats.snapshot import safetensors_weights, write_snapshot


class History:
    """What a learner with `snapshot_deltas` leaves on disk: a snapshot at `keyframes`,
    a delta file for every other version (bf16 weights, a few values moved per step)."""

    def __init__(self, root, *, seed: int = 0, start: dict | None = None) -> None:
        self.root = root
        self.log = DeltaLogWriter(root / "deltas")
        self.generator = torch.Generator().manual_seed(seed)
        self.master = start or {
            "embed.weight": torch.randn(64, 16, generator=self.generator),
            "layers.0.mlp.weight": torch.randn(16, 16, generator=self.generator),
        }
        self.versions: dict[int, dict[str, torch.Tensor]] = {}
        self.snapshot: tuple[str, int] = ("", -1)

    def write(self, version: int, *, snapshot: bool = False) -> None:
        named = {n: t.to(torch.bfloat16) for n, t in self.master.items()}
        self.versions[version] = named
        for _ in self.log.tee(version, named.items()):
            pass
        if snapshot:
            path = write_snapshot(self.root / "weights", version, named.items())
            self.snapshot = (str(path), version)
            self.log.prune(through=version)
        for t in self.master.values():
            t.add_(torch.randn(t.shape, generator=self.generator) * 2e-3)

    def announce(self, version: int, *, log: bool = True) -> PolicyVersion:
        return PolicyVersion(
            version=version,
            published_at=0.0,
            snapshot_path=self.snapshot[0],
            snapshot_version=self.snapshot[1],
            deltas_path=str(self.log.directory) if log else "",
        )


def _bits_equal(path: str, expected: dict[str, torch.Tensor]) -> bool:
    got = dict(safetensors_weights(path))
    return got.keys() == expected.keys() and all(
        torch.equal(got[n].view(torch.uint8), t.view(torch.uint8)) for n, t in expected.items()
    )


def _history(tmp_path, last: int, keyframes=(0, 4)) -> History:
    history = History(tmp_path / "learner")
    for version in range(last + 1):
        history.write(version, snapshot=version in keyframes)
    return history


async def test_a_late_joiner_rebuilds_the_announced_version_then_follows_from_its_own(tmp_path):
    history = _history(tmp_path, last=6)
    reader = WeightLogReader(SnapshotSource())
    path, version, kind = await reader.newest(history.announce(6), engine_version=-1)
    assert (version, kind) == (6, "log") and reader.num_deltas_applied == 2  # v4 + 5 + 6
    assert _bits_equal(path, history.versions[6])

    history.write(7)
    newer, version, kind = await reader.newest(history.announce(7), engine_version=6)
    assert (version, kind) == (7, "log") and reader.num_deltas_applied == 3  # its v6 + 7
    assert _bits_equal(newer, history.versions[7])
    assert not (tmp_path / path).exists()  # one rebuild kept
    assert await reader.newest(history.announce(7), engine_version=7) is None
    reader.close()


async def test_the_chain_stops_at_a_missing_delta_until_the_next_snapshot(tmp_path):
    history = _history(tmp_path, last=5)
    reader = WeightLogReader(SnapshotSource())
    _, version, _ = await reader.newest(history.announce(5), engine_version=-1)
    assert version == 5
    history.write(6)
    history.write(7)
    (history.log.directory / "v000006.delta").unlink()  # lost (a disk, a sync that failed)
    assert await reader.newest(history.announce(7), engine_version=5) is None
    history.write(8, snapshot=True)
    history.write(9)
    path, version, kind = await reader.newest(history.announce(9), engine_version=5)
    assert (version, kind) == (9, "log") and _bits_equal(path, history.versions[9])


async def test_a_rebuild_of_a_rolled_back_history_is_never_continued(tmp_path):
    history = _history(tmp_path, last=7)
    reader = WeightLogReader(SnapshotSource())
    _, version, _ = await reader.newest(history.announce(7), engine_version=-1)
    assert version == 7
    # The learner dies and resumes from its checkpoint at v5: v6 and v7 are trained again,
    # differently, and their deltas replaced; our v7 is of the lost history.
    resumed = History(tmp_path / "learner", seed=1, start={
        n: t.float().clone() for n, t in history.versions[5].items()})  # fmt: skip
    resumed.log.prune(above=5)
    for version in range(5, 9):
        resumed.write(version, snapshot=version == 5)
    path, version, kind = await reader.newest(resumed.announce(8), engine_version=7)
    assert (version, kind) == (8, "log")
    assert _bits_equal(path, resumed.versions[8])  # replayed from snapshot v5, not from ours


async def test_without_a_log_the_snapshot_alone_is_loaded(tmp_path):
    history = _history(tmp_path, last=6)
    reader = WeightLogReader(SnapshotSource())
    path, version, kind = await reader.newest(history.announce(6, log=False), engine_version=0)
    assert (path, version, kind) == (history.snapshot[0], 4, "snapshot")
    assert await reader.newest(history.announce(6, log=False), engine_version=4) is None


def _keys(storage, prefix: str) -> list[str]:
    from common.s3 import ObjectStore

    return sorted(k.rsplit("/", 1)[-1] for k in ObjectStore(storage).listing(prefix))


async def test_an_actor_at_another_site_rebuilds_the_version_from_the_bucket(s3_storage, tmp_path):
    storage = s3_storage(cache_dir=str(tmp_path / "cache"))
    sync = open_artifacts(storage, run_name="remote", checkpoint_root=tmp_path / "ckpt",
                          keep_local=1, resume=False)  # fmt: skip
    history = History(tmp_path / "learner")
    for version in range(7):  # as RankCommands does: the snapshot, then the delta, queued
        history.write(version, snapshot=version in (0, 4))
        if history.snapshot[1] == version:
            sync.snapshot_written(Path(history.snapshot[0]), version)
        if history.log.last_path is not None:
            sync.delta_written(history.log.last_path, version)
    assert await asyncio.to_thread(sync.wait_idle, 60) and sync.num_failures == 0
    layout = storage.layout("remote")
    assert _keys(storage, layout.deltas_root) == ["v000005.delta", "v000006.delta"]
    url, snapshot_version = sync.announced_snapshot(None)
    announced = PolicyVersion(version=6, published_at=0.0, snapshot_path=url,
        snapshot_version=snapshot_version, deltas_path=sync.deltas_url)  # fmt: skip
    assert snapshot_version == 4 and announced.deltas_path.startswith("s3://")

    reader = WeightLogReader(SnapshotSource(storage))
    path, version, kind = await reader.newest(announced, engine_version=-1)
    assert (version, kind) == (6, "log") and _bits_equal(path, history.versions[6])
    assert path.startswith(str(tmp_path / "cache"))
    sync.close(timeout_s=10)

    # A learner that starts over (or resumes below them) deletes the abandoned deltas.
    again = open_artifacts(storage, run_name="remote", checkpoint_root=tmp_path / "ckpt",
                           keep_local=1, resume=False)  # fmt: skip
    again.close(timeout_s=10)
    assert _keys(storage, layout.deltas_root) == []
