"""The actor side of the weight path: keeps one replica's engine on the learner's policy.

It follows the policy-version KV, and from each announcement:
- loads the announced snapshot while no broadcast is followed (start-up, a replica without
  one): the snapshot fallback path;
- rolls back: a learner that restarts announces a new lineage at its checkpoint's
  version, and an engine holding newer weights (from the history the crash undid) reloads
  the announced snapshot; generating on them would tag tokens with versions the learner
  has not reached, and every group would be dropped as `future` until it had (a stall);
- joins the learner's broadcast rounds (`weights.actor_side.follower.BroadcastFollower`), and when a
  round fails part-way through its load (streamed loads leave the engine's weights mixed,
  generation paused) loads the announced snapshot at once instead of waiting for the next.
A task waits here until the engine's version reaches its `min_version`, catching up from
the announced snapshot when a round went out without us or the wait ran past
`version_wait_s`, and raising `WeightsBehind` (the task goes back) when no snapshot can.

Every snapshot load goes through one method, which resolves the announced path through
`SnapshotSource` (a local directory as announced, an s3:// URL downloaded) first."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine

from actors import metrics
from actors.snapshots import SnapshotSource
from actors.types import ActorEngine
from actors.weight_log import WeightLogReader
from broker import client as bus
from broker.wire import PolicyVersion
from weights.actor_side.follower import WeightUpdateError

log = logging.getLogger(__name__)


class WeightsBehind(Exception):
    """The engine cannot get the weights a task needs in time: hand the task back."""


class PolicyWeights:
    """`await start(policy)` before the first generation, run `follow()` for the replica's
    life, `await wait_for_version(v)` before a task, `await stop()` at the end.

    `background` runs a coroutine that must live as long as the replica (the broadcast
    follower): the actor stops when it fails."""

    def __init__(
        self,
        *,
        engine: ActorEngine,
        snapshots: SnapshotSource,
        version_wait_s: float,
        background: Callable[[Coroutine], asyncio.Task],
        weight_source: str = "broadcast",
    ) -> None:
        self.engine, self.snapshots = engine, snapshots
        self.follows_broadcast = weight_source == "broadcast"
        self.weights_log = WeightLogReader(snapshots)
        self.version_wait_s = version_wait_s
        self._background = background
        self.newest_version = -1
        self.num_rollbacks = 0
        self.started = False
        self._policy: bus.PolicyStore | None = None
        self._version_changed = asyncio.Event()
        self._broadcast: asyncio.Task | None = None
        self._broadcast_addr = ""
        self._follower = None
        self._lineage: str | None = None
        self._announced: PolicyVersion | None = None
        self._catch_up_lock = asyncio.Lock()

    @property
    def current(self) -> bool:
        """Start-up weights settled, and the newest announced version held or the learner's
        broadcast followed (what /readyz reports while the replica runs)."""
        if not self.started:
            return False
        return self._follower is not None or self.engine.version >= self.newest_version

    async def start(self, policy: bus.PolicyStore) -> None:
        """Before the first generation: the newest snapshot, and the broadcast if any."""
        self._policy = policy
        announced = await policy.get()
        if announced is not None:
            await self._on_policy(announced)
        self._record_versions()
        self.started = True

    async def follow(self) -> None:
        """Every later announcement, for the replica's life."""
        assert self._policy is not None, "start() first"
        async for announced in self._policy.follow():
            await self._on_policy(announced)

    async def stop(self) -> None:
        """Stop following the broadcast and leave its group."""
        if self._broadcast is not None:
            self._broadcast.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._broadcast
            self._broadcast = None
        if self._follower is not None:
            await self._follower.leave()
            self._follower = None

    async def _on_policy(self, announced: PolicyVersion) -> None:
        self._announced = announced
        if announced.lineage != self._lineage:
            rolled_back = self._lineage is not None and self.engine.version > announced.version
            self._lineage = announced.lineage
            self.newest_version = announced.version  # a resumed learner may be behind us
            if rolled_back:
                await self._roll_back(announced)
        self.newest_version = max(self.newest_version, announced.version)
        # While rounds keep the engine current, a snapshot load could race one and go back
        # a version: snapshots and the log serve replicas without a broadcast (start-up,
        # `weight_source = "store"`; and see `_missed`).
        if self._broadcast is None:
            await self._catch_up_from_store(announced)
        if (
            self.follows_broadcast
            and announced.broadcast_addr
            and announced.broadcast_addr != self._broadcast_addr
        ):
            await self.stop()  # a restarted learner serves a new store
            self._broadcast_addr = announced.broadcast_addr
            self._start_broadcast(announced.broadcast_addr)
        self._record_versions()

    async def _catch_up_from_store(self, announced: PolicyVersion) -> None:
        """The newest version the announced snapshot and the weights log reach, loaded
        when newer than the engine's (actors/weight_log.py). Unreadable (the learner
        rotated a file away after announcing it): keep the weights we have, as staged
        loads leave them; a newer announcement tries again."""
        try:
            newest = await self.weights_log.newest(announced, self.engine.version)
            if newest is None:
                return
            path, version, kind = newest
            log.info("loading weights v%d (%s)", version, kind)
            stall_s = await self.engine.load_snapshot(path, version)
        except WeightUpdateError as e:
            what = f"snapshot v{announced.snapshot_version}"
            what += " (nor the weights log after it)" if announced.deltas_path else ""
            log.warning("weights %s not loaded: %s", what, e)
        else:
            metrics.WEIGHT_UPDATE_STALL_SECONDS.labels(kind).observe(stall_s)

    async def _load_snapshot(self, announced: PolicyVersion) -> float:
        """Load the announced snapshot, its path resolved through `SnapshotSource` (an
        s3:// one downloaded first); the stall in seconds. WeightUpdateError when it cannot
        be had or read (the engine keeps its weights, as staged loads leave them)."""
        path = await self.snapshots.local_path(announced.snapshot_path, announced.snapshot_version)
        return await self.engine.load_snapshot(path, announced.snapshot_version)

    async def _roll_back(self, announced: PolicyVersion) -> None:
        """The learner resumed below our weights' version: go back to its snapshot. The
        broadcast follower then joins the rounds after that version."""
        self.num_rollbacks += 1
        log.warning("the learner resumed at v%d (lineage %s), below this engine's v%d: "
                    "reloading snapshot v%d", announced.version, announced.lineage,
                    self.engine.version, announced.snapshot_version)  # fmt: skip
        if not announced.snapshot_path or announced.snapshot_version > announced.version:
            log.error("no snapshot at or below v%d to roll back to", announced.version)
            return
        error = await self._load_snapshot_recorded(announced)
        # Unreadable: we keep the newer weights; their groups are dropped as `future` until
        # a broadcast round brings the learner's own.
        if error is not None:
            log.error("rollback snapshot v%d not loaded: %s", announced.snapshot_version, error)

    async def _load_snapshot_recorded(self, announced: PolicyVersion) -> WeightUpdateError | None:
        """`_load_snapshot`, its stall recorded; the error when the snapshot could not be
        had or read (the caller says what that leaves the engine with)."""
        try:
            stall_s = await self._load_snapshot(announced)
        except WeightUpdateError as e:
            return e
        metrics.WEIGHT_UPDATE_STALL_SECONDS.labels("snapshot").observe(stall_s)
        return None

    def _start_broadcast(self, address: str) -> None:
        from weights.actor_side.follower import BroadcastFollower

        def on_update(update) -> None:
            metrics.WEIGHT_UPDATE_STALL_SECONDS.labels("broadcast").observe(update.stall_s)
            metrics.WEIGHT_WIRE_SECONDS.inc(update.wire_s)
            metrics.WEIGHT_UPDATE_BYTES.inc(update.num_bytes)
            self._record_versions()

        self._follower = BroadcastFollower(
            self.engine, address, on_update=on_update, on_failure=self._recover_mixed
        )
        self._broadcast = self._background(self._follower.run())

    async def _recover_mixed(self, error: WeightUpdateError) -> None:
        """A broadcast round failed (the follower calls this before it waits for the next).
        If its load had begun, the engine's weights are mixed and generation is paused:
        load the newest announced snapshot now. It may be older than the engine's version
        before the round: tokens are then tagged with the snapshot's version, tasks that
        need a newer one wait as usual, and the next round brings the engine current."""
        if not error.weights_mixed:
            return
        announced = self._announced
        if announced is None or not announced.snapshot_path:
            log.error("weights mixed by a failed round and no snapshot announced: generation "
                      "paused until the next round")  # fmt: skip
            return
        log.warning("weights mixed by a failed round: loading snapshot v%d",
                    announced.snapshot_version)  # fmt: skip
        error = await self._load_snapshot_recorded(announced)
        if error is not None:  # unreadable (rotated away): paused until the next round
            log.error("snapshot v%d not loaded: %s", announced.snapshot_version, error)
        self._record_versions()

    def _record_versions(self) -> None:
        metrics.record_versions(
            engine_version=self.engine.version,
            newest_version=max(self.newest_version, self.engine.version),
        )
        self._version_changed.set()

    async def wait_for_version(self, min_version: int) -> None:
        """Wait (measured) until the engine's weights may generate a task of min_version.
        The learner announced that version before releasing the task, so a broadcast
        normally brings it. When one did without a seat for us, only the learner's next
        round would, after data that may be ours: catch up from the announced snapshot
        once it is new enough. A wait past `version_wait_s` means the usual way is broken:
        catch up, or raise WeightsBehind (the task goes to another replica)."""
        started = time.monotonic()
        try:
            while self.engine.version < min_version:
                waited_s = time.monotonic() - started
                if waited_s > self.version_wait_s or self._missed(min_version):
                    await self._catch_up_from_snapshot(min_version)
                    continue
                self._version_changed.clear()
                # Polled as well: a broadcast round changes engine.version on its own.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._version_changed.wait(), timeout=0.5)
        finally:
            metrics.WAIT_SECONDS.labels("weights").inc(time.monotonic() - started)

    def _missed(self, min_version: int) -> bool:
        """A round of min_version or later went out without us, and a snapshot has it."""
        missed = self._follower.missed_version if self._follower else -1
        snapshot = self._announced.snapshot_version if self._announced else -1
        return min(missed, snapshot) >= min_version

    async def _catch_up_from_snapshot(self, min_version: int) -> None:
        snapshot = self._announced
        if (
            snapshot is None
            or not snapshot.snapshot_path
            or snapshot.snapshot_version < min_version
        ):
            raise WeightsBehind(f"at v{self.engine.version}, no snapshot of v{min_version} yet")
        async with self._catch_up_lock:  # one load for all the tasks that wait
            if self.engine.version >= min_version:
                return
            log.warning("weights at v%d, v%d needed: loading snapshot v%d",
                        self.engine.version, min_version, snapshot.snapshot_version)  # fmt: skip
            try:
                await self._load_snapshot(snapshot)
            except WeightUpdateError as e:
                raise WeightsBehind(f"snapshot v{snapshot.snapshot_version}: {e}") from e
