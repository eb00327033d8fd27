"""Where a replica reads an announced weights snapshot from: a local directory as announced,
or, for an `s3://` URL (the learner uploads snapshots when `[storage]` names a bucket), a
verified download into a cache directory (docs/storage.md, late joiners).

The engine's workers read a directory of safetensors (`VllmEngine.load_snapshot`), so the
download lands in `<cache>/global_step_<V>/` first; only the newest download is kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from pathlib import Path

from common.objectstore import parse_url
from common.storage_config import StorageConfig
from weights.follower import WeightUpdateError

log = logging.getLogger(__name__)


class SnapshotSource:
    """`await local_path(announced_path, version)` -> a directory the engine can load."""

    def __init__(self, storage: StorageConfig | None = None) -> None:
        self.storage = storage if storage is not None and storage.enabled else None
        self._store = None
        self._cache: Path | None = None
        self._downloaded: Path | None = None

    async def local_path(self, announced: str, version: int) -> str:
        """The announced path itself when local; a verified download of an s3:// one.
        WeightUpdateError when it cannot be had (the caller keeps its weights)."""
        if not announced.startswith("s3://"):
            return announced
        if self.storage is None:
            raise WeightUpdateError(
                f"snapshot {announced} is in a bucket, and this actor has no [storage] section"
            )
        from common.s3 import StorageError

        try:
            return str(await asyncio.to_thread(self._download, announced, version))
        # Network boundary: the bucket is unreachable or the object did not verify; a newer
        # snapshot or a broadcast round follows.
        except StorageError as e:
            raise WeightUpdateError(f"snapshot {announced} not downloaded: {e}") from e

    def _download(self, url: str, version: int) -> Path:
        from common.s3 import ObjectStore

        bucket, directory = parse_url(url)
        if bucket != self.storage.bucket:
            raise WeightUpdateError(f"{url} is not in bucket {self.storage.bucket!r}")
        if self._store is None:
            self._store = ObjectStore(self.storage)
        target = self._cache_dir() / f"global_step_{version}"
        self._store.download_artifact(directory.rstrip("/") + "/", target)
        previous, self._downloaded = self._downloaded, target
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)
        log.info("downloaded weights snapshot v%d from %s", version, url)
        return target

    def _cache_dir(self) -> Path:
        if self._cache is None:
            if self.storage.cache_dir is not None:  # one directory per replica process
                self._cache = Path(self.storage.cache_dir) / f"replica-{os.getpid()}"
                self._cache.mkdir(parents=True, exist_ok=True)
            else:
                self._cache = Path(tempfile.mkdtemp(prefix="tether-snapshots-"))
        return self._cache
