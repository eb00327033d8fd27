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
from typing import TYPE_CHECKING

from common.objectstore import parse_url
from common.storage_config import StorageConfig
from weights.actor_side.follower import WeightUpdateError
from weights.formats.delta_log import delta_name, delta_version

if TYPE_CHECKING:
    from common.s3 import ObjectStore

log = logging.getLogger(__name__)


class SnapshotSource:
    """`await local_path(announced_path, version)` -> a directory the engine can load."""

    def __init__(self, storage: StorageConfig | None = None) -> None:
        self.storage = storage if storage is not None and storage.enabled else None
        self._store = None
        self._cache: Path | None = None
        self._downloaded: Path | None = None
        self._temporary = False

    async def local_path(self, announced: str, version: int) -> str:
        """The announced path itself when local; a verified download of an s3:// one.
        WeightUpdateError when it cannot be had (the caller keeps its weights)."""
        if not announced.startswith("s3://"):
            return announced
        return str(await self._from_bucket(self._download, announced, version))

    async def delta_files(self, announced: str, versions: range) -> list[Path]:
        """The weights log's files of `versions`, in order, as far as they run unbroken
        (actors/weight_log.py): the announced directory's own, or downloads of an s3://
        one into the cache. WeightUpdateError when the bucket cannot be read."""
        if announced.startswith("s3://"):
            return await self._from_bucket(self._download_deltas, announced, versions)
        paths = []
        for version in versions:
            path = Path(announced) / delta_name(version)
            if not path.is_file():
                break  # written in order: the log reaches no further yet
            paths.append(path)
        return paths

    async def _from_bucket(self, download, url: str, *args):
        if self.storage is None:
            raise WeightUpdateError(
                f"weights at {url} are in a bucket, and this actor has no [storage] section"
            )
        from common.s3 import StorageError

        try:
            return await asyncio.to_thread(download, url, *args)
        # Network boundary: the bucket is unreachable or the object did not verify; a newer
        # snapshot or a broadcast round follows.
        except StorageError as e:
            raise WeightUpdateError(f"{url} not downloaded: {e}") from e

    def _bucket(self, url: str) -> tuple[ObjectStore, str]:
        """The store and the key prefix of `url`, which must be in our bucket."""
        from common.s3 import ObjectStore

        bucket, key = parse_url(url)
        if bucket != self.storage.bucket:
            raise WeightUpdateError(f"{url} is not in bucket {self.storage.bucket!r}")
        if self._store is None:
            self._store = ObjectStore(self.storage)
        return self._store, key

    def _download_deltas(self, url: str, versions: range) -> list[Path]:
        store, prefix = self._bucket(url)
        listing = store.listing(prefix)
        local = self.cache_dir() / "deltas"
        local.mkdir(exist_ok=True)
        for old in local.glob("*.delta"):  # applied already
            if (delta_version(old.name) or 0) < versions.start:
                old.unlink(missing_ok=True)
        paths = []
        for version in versions:
            key, target = prefix + delta_name(version), local / delta_name(version)
            if key not in listing:
                break
            if not target.is_file() or target.stat().st_size != listing[key]:
                store.download_file(key, target.with_name(target.name + ".part")).replace(target)
            paths.append(target)
        return paths

    def _download(self, url: str, version: int) -> Path:
        store, directory = self._bucket(url)
        target = self.cache_dir() / f"global_step_{version}"
        store.download_artifact(directory.rstrip("/") + "/", target)
        previous, self._downloaded = self._downloaded, target
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)
        log.info("downloaded weights snapshot v%d from %s", version, url)
        return target

    def cache_dir(self) -> Path:
        """This replica's directory for downloads and rebuilt versions (actors/weight_log.py)."""
        if self._cache is None:
            if self.storage is not None and self.storage.cache_dir is not None:  # per replica
                self._cache = Path(self.storage.cache_dir) / f"replica-{os.getpid()}"
                self._cache.mkdir(parents=True, exist_ok=True)
            else:
                self._cache = Path(tempfile.mkdtemp(prefix="tether-snapshots-"))
                self._temporary = True
        return self._cache

    def close(self) -> None:
        """At the replica's end: a temporary cache directory is deleted with what it holds."""
        if self._cache is not None and self._temporary:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None
