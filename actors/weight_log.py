"""An engine that does not follow the learner's broadcast reaches every announced version
from the object store: the newest snapshot (the keyframe) plus the weights log's deltas
(`learner.snapshot_deltas`, weights/formats/delta_log.py), replayed bit for bit into a directory
the engine loads like a snapshot (docs/weights.md, "The weights log").

    announced v12, snapshot v10, log d/ ─► base: our own rebuild of v11 (when it is of this
        history: its fingerprint must be the next delta's base) or else snapshot v10
      ─► the consecutive deltas after the base that the log holds (v11?, v12)
      ─► replay, shard by shard ─► <cache>/v000012/ (the previous rebuild deleted)
      ─► engine.load_snapshot(<cache>/v000012, 12)

A break in the chain (a delta missing, or of another history after a learner resumed) is
never loaded: the replay starts again from the snapshot, and failing that the snapshot
itself is loaded, as before the log existed. Only the rebuild is kept: one copy of the
model on the replica's disk.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from actors.snapshots import SnapshotSource
from broker.wire import PolicyVersion
from weights.actor_side.follower import WeightUpdateError
from weights.formats.delta_log import DeltaFile, replay
from weights.formats.snapshot import SnapshotWriter, safetensors_weights
from weights.shared.delta import DeltaMismatch

log = logging.getLogger(__name__)


Newest = tuple[str, int, str]
"""(directory to load, its version, "log" for a rebuild or "snapshot")."""


@dataclass(frozen=True)
class Rebuild:
    """A version this replica rebuilt: its directory and every tensor's CRC-32."""

    path: Path
    version: int
    crcs: dict[str, int]


class WeightLogReader:
    """`await newest(announced, held_version)` -> (directory, version) to load, or None."""

    def __init__(self, snapshots: SnapshotSource) -> None:
        self.snapshots = snapshots
        self.held: Rebuild | None = None
        self.num_deltas_applied = 0

    async def newest(self, announced: PolicyVersion, engine_version: int) -> Newest | None:
        """(directory, version, "log" or "snapshot") of the newest version the snapshot and
        the log reach, if newer than `engine_version`. WeightUpdateError when neither can
        be read."""
        if not announced.deltas_path:
            return await self._snapshot_only(announced, engine_version)
        held = self.held
        if held is not None and (
            held.version > announced.version or held.version < announced.snapshot_version
        ):
            held = None  # of a rolled-back history, or older than the keyframe
        if held is not None:
            try:
                return await self._rebuilt(held.path, held, announced, engine_version)
            except DeltaMismatch as e:
                log.warning("weights log: %s; replaying from snapshot v%d instead", e,
                            announced.snapshot_version)  # fmt: skip
        if not announced.snapshot_path:
            return None
        base = await self.snapshots.local_path(announced.snapshot_path, announced.snapshot_version)
        try:
            return await self._rebuilt(base, None, announced, engine_version)
        except DeltaMismatch as e:
            log.warning("weights log: %s; loading snapshot v%d alone", e,
                        announced.snapshot_version)  # fmt: skip
            return await self._snapshot_only(announced, engine_version)

    async def _snapshot_only(self, announced: PolicyVersion, engine_version: int) -> Newest | None:
        if not announced.snapshot_path or announced.snapshot_version <= engine_version:
            return None
        version = announced.snapshot_version
        path = await self.snapshots.local_path(announced.snapshot_path, version)
        return path, version, "snapshot"

    async def _rebuilt(
        self, base: str | Path, held: Rebuild | None, announced, engine_version
    ) -> Newest | None:
        start = held.version if held is not None else announced.snapshot_version
        wanted = range(start + 1, announced.version + 1)
        paths = await self.snapshots.delta_files(announced.deltas_path, wanted)
        target = start + len(paths)
        if target <= engine_version:
            return None
        if not paths:  # the base itself is the newest (the snapshot: held is loaded)
            return str(base), target, "snapshot" if held is None else "log"
        rebuild = await asyncio.to_thread(self._replay, Path(base), held, paths, target)
        previous, self.held = self.held, rebuild
        if previous is not None and previous.path != rebuild.path:
            shutil.rmtree(previous.path, ignore_errors=True)
        self.num_deltas_applied += len(paths)
        return str(rebuild.path), target, "log"

    def _replay(self, base: Path, held: Rebuild | None, paths: list[Path], target: int) -> Rebuild:
        deltas: list[DeltaFile] = []
        writer = SnapshotWriter(self.snapshots.cache_dir(), target)
        try:
            deltas = [DeltaFile(p) for p in paths]
            crcs = {}
            base_crcs = held.crcs if held is not None else None
            for name, tensor, crc in replay(safetensors_weights(base), base_crcs, deltas):
                writer.add(name, tensor)
                crcs[name] = crc
            return Rebuild(writer.finish(), target, crcs)
        except (OSError, ValueError) as e:  # DeltaMismatch is a ValueError: the caller's
            writer.discard()
            if isinstance(e, DeltaMismatch):
                raise
            # A file rotated away or cut short under us: the next announcement tries again.
            raise WeightUpdateError(f"weights log replay to v{target}: {e}") from e
        finally:
            for delta in deltas:
                delta.close()

    def close(self) -> None:
        """Delete the rebuild and a temporary cache (at the replica's end)."""
        if self.held is not None:
            shutil.rmtree(self.held.path, ignore_errors=True)
            self.held = None
        self.snapshots.close()
