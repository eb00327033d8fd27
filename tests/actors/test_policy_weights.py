"""`PolicyWeights` on its own, with an in-memory policy-version KV and the scripted engine:
every snapshot it loads (at start-up, in a rollback, in a catch-up, after a failed round
left the weights mixed) is the local directory `SnapshotSource` resolved the announced path
to, never the announced s3:// URL itself."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from actors.policy_weights import PolicyWeights, WeightsBehind
from actors.snapshots import SnapshotSource
from broker.wire import PolicyVersion
from tests.fakes import ScriptedEngine, ScriptedFollower, SilentFollower, by_turn


class BucketSnapshots(SnapshotSource):
    """Announced s3:// URLs -> the local directories their downloads would land in."""

    def __init__(self) -> None:
        super().__init__()
        self.resolved: list[tuple[str, int]] = []

    async def local_path(self, announced: str, version: int) -> str:
        assert announced.startswith("s3://")
        self.resolved.append((announced, version))
        return f"/cache/global_step_{version}"


class Announcements:
    """The policy-version KV in memory: `get` the first announcement, `follow` later ones;
    `announce` returns once the follower has handled it."""

    def __init__(self, first: PolicyVersion) -> None:
        self.first = first
        self._later: asyncio.Queue[PolicyVersion] = asyncio.Queue()

    async def get(self) -> PolicyVersion:
        return self.first

    async def follow(self):
        while True:
            yield await self._later.get()
            self._later.task_done()  # the follower asked for the next one: this one is done

    async def announce(self, announced: PolicyVersion) -> None:
        await self._later.put(announced)
        await self._later.join()


def _announced(version: int, *, snapshot_version: int, lineage: str = "a", broadcast_addr=""):
    return PolicyVersion(
        version=version,
        published_at=0.0,
        snapshot_path=f"s3://bucket/tether/{lineage}/weights/v{snapshot_version:06d}/",
        snapshot_version=snapshot_version,
        lineage=lineage,
        broadcast_addr=broadcast_addr,
    )


@contextlib.asynccontextmanager
async def _following(first: PolicyVersion, *, version_wait_s: float = 600.0):
    engine = ScriptedEngine(None, by_turn("unused"))
    snapshots = BucketSnapshots()
    weights = PolicyWeights(
        engine=engine,
        snapshots=snapshots,
        version_wait_s=version_wait_s,
        background=asyncio.create_task,
    )
    policy = Announcements(first)
    await weights.start(policy)
    following = asyncio.create_task(weights.follow())
    try:
        yield weights, policy, engine, snapshots
    finally:
        following.cancel()
        await weights.stop()


async def test_a_rollback_loads_the_resolved_snapshot_of_the_new_lineage():
    async with _following(_announced(7, snapshot_version=7)) as (weights, policy, engine, _):
        assert engine.snapshots_loaded == [("/cache/global_step_7", 7)]  # at start-up
        await policy.announce(_announced(4, snapshot_version=4, lineage="b"))
    assert engine.snapshots_loaded == [("/cache/global_step_7", 7), ("/cache/global_step_4", 4)]
    assert weights.num_rollbacks == 1 and weights.newest_version == 4


async def test_a_catch_up_loads_the_resolved_snapshot(monkeypatch):
    # The broadcast never delivers: past version_wait_s the task's version comes from the
    # announced snapshot, downloaded from the bucket.
    monkeypatch.setattr("weights.actor_side.follower.BroadcastFollower", SilentFollower)
    first = _announced(3, snapshot_version=3, broadcast_addr="127.0.0.1:9")
    async with _following(first, version_wait_s=0.0) as (weights, policy, engine, snapshots):
        await policy.announce(_announced(5, snapshot_version=5, broadcast_addr="127.0.0.1:9"))
        assert engine.version == 3  # broadcast followed: the snapshot is not loaded by itself
        await weights.wait_for_version(5)
        with pytest.raises(WeightsBehind, match="no snapshot of v6"):
            await weights.wait_for_version(6)
    assert engine.snapshots_loaded == [("/cache/global_step_3", 3), ("/cache/global_step_5", 5)]
    assert [version for _, version in snapshots.resolved] == [3, 5]


async def test_weights_mixed_by_a_failed_round_load_the_newest_snapshot_at_once(monkeypatch):
    # Streamed loads: a round that fails part-way leaves the engine paused on mixed weights.
    # The newest snapshot is loaded right away, even one older than the engine's version
    # (tokens then carry the snapshot's version); a task needing more waits for a round.
    monkeypatch.setattr(ScriptedFollower, "made", [])
    monkeypatch.setattr("weights.actor_side.follower.BroadcastFollower", ScriptedFollower)
    first = _announced(5, snapshot_version=5, broadcast_addr="127.0.0.1:9")
    async with _following(first) as (weights, policy, engine, _):
        [follower] = ScriptedFollower.made
        follower.land(6)
        await policy.announce(_announced(6, snapshot_version=5, broadcast_addr="127.0.0.1:9"))
        await follower.fail(weights_mixed=False)  # nothing loaded: the old weights stand
        assert engine.snapshots_loaded == [("/cache/global_step_5", 5)] and engine.version == 6
        await follower.fail(weights_mixed=True)
        assert engine.snapshots_loaded[1:] == [("/cache/global_step_5", 5)]
        assert engine.version == 5
        waiting = asyncio.create_task(weights.wait_for_version(6))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # no newer snapshot: the next round brings it
        follower.land(7)
        await asyncio.wait_for(waiting, timeout=5.0)


async def test_weights_mixed_without_a_snapshot_wait_for_the_next_round(monkeypatch):
    monkeypatch.setattr(ScriptedFollower, "made", [])
    monkeypatch.setattr("weights.actor_side.follower.BroadcastFollower", ScriptedFollower)
    first = PolicyVersion(version=0, published_at=0.0, lineage="a", broadcast_addr="127.0.0.1:9")
    async with _following(first) as (_, _, engine, _):
        await ScriptedFollower.made[0].fail(weights_mixed=True)
        assert engine.snapshots_loaded == []
