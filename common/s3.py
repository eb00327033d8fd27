"""Run artifacts to and from an S3-compatible bucket with boto3: thin I/O over the rules of
`common/objectstore.py` (layout, manifest, completeness, pruning).

    upload_artifact(dir) : each file -> upload (SHA-256 checksum sent) -> HEAD: size and the
                           store's SHA-256 equal the local file's -> then manifest.json
    download_artifact    : manifest -> each file -> local SHA-256 equals the manifest's;
                           the local marker (state.json) last
    delete_artifact      : manifest first, then the rest

Verification: the local file is hashed before its upload (the whole-file SHA-256 for the
manifest, and per part for multipart uploads); boto3 sends each part's SHA-256, which the
store checks on receipt; afterwards a HEAD must report the local size and the SHA-256 the
store computed (for multipart objects the composite: SHA-256 of the parts' digests, with
the part size s3transfer used). A file that changed while it was being uploaded, a
truncated or misplaced object, fails the check. Downloads are hashed against the manifest.

Errors from the store (after botocore's own retries) become `StorageError`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from common.objectstore import (
    MANIFEST,
    FileEntry,
    Manifest,
    RunLayout,
    is_complete,
    steps_in_listing,
    upload_order,
)
from common.storage_config import StorageConfig

log = logging.getLogger(__name__)
_READ_BYTES = 8 << 20


class StorageError(RuntimeError):
    """A request to the store failed, or an object did not verify."""


def file_digests(path: Path, part_size: int | None) -> tuple[str, str]:
    """(hex SHA-256 of the file, the base64 SHA-256 S3 records for it): the file's own for a
    single-part upload, else the composite over parts of `part_size` bytes."""
    whole = hashlib.sha256()
    part_digests: list[bytes] = []
    with open(path, "rb") as f:
        while True:
            part = hashlib.sha256()
            remaining = part_size or _READ_BYTES
            while remaining > 0 and (block := f.read(min(_READ_BYTES, remaining))):
                whole.update(block)
                part.update(block)
                remaining -= len(block)
            if remaining == (part_size or _READ_BYTES):
                break  # end of file
            part_digests.append(part.digest())
    if part_size is None:
        recorded = whole.digest()
    else:
        recorded = hashlib.sha256(b"".join(part_digests)).digest()
    return whole.hexdigest(), base64.b64encode(recorded).decode()


class ObjectStore:
    """One bucket, through a boto3 client; credentials from the environment only."""

    def __init__(self, config: StorageConfig) -> None:
        import boto3
        import botocore.config
        from boto3.s3.transfer import TransferConfig

        if config.bucket is None:
            raise ValueError("storage.bucket is not set")
        self.config = config
        self.bucket = config.bucket
        chunk = config.multipart_chunk_mib << 20
        self.transfer = TransferConfig(
            multipart_threshold=chunk,
            multipart_chunksize=chunk,
            max_concurrency=config.max_concurrency,
        )
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            config=botocore.config.Config(
                retries={"max_attempts": config.max_attempts, "mode": "standard"},
                s3={"addressing_style": config.addressing_style},
            ),
        )

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        """Network boundary: botocore has already retried; say which request failed."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except (ClientError, BotoCoreError, Boto3Error) as e:
            raise StorageError(f"{what}: {e}") from e

    # ---- single objects --------------------------------------------------------------------

    def _part_size(self, size: int) -> int | None:
        """The part size s3transfer uses for a file of `size` bytes; None: one PUT."""
        from s3transfer.utils import ChunksizeAdjuster

        if size < self.transfer.multipart_threshold:
            return None
        return ChunksizeAdjuster().adjust_chunksize(self.transfer.multipart_chunksize, size)

    def upload_file(self, path: Path, key: str, *, progress: Callable | None = None) -> FileEntry:
        """Upload and verify one file; the entry's `path` is the file's name."""
        size = path.stat().st_size
        sha256, recorded = file_digests(path, self._part_size(size))
        self._call(
            f"upload {path} to s3://{self.bucket}/{key}",
            self.client.upload_file,
            str(path),
            self.bucket,
            key,
            ExtraArgs={"ChecksumAlgorithm": "SHA256"},
            Callback=progress,
            Config=self.transfer,
        )
        head = self._call(
            f"head s3://{self.bucket}/{key}",
            self.client.head_object,
            Bucket=self.bucket,
            Key=key,
            ChecksumMode="ENABLED",
        )
        if head["ContentLength"] != size:
            raise StorageError(
                f"s3://{self.bucket}/{key}: {head['ContentLength']} bytes, not {size}"
            )
        if self.config.verify_checksum:
            stored = (head.get("ChecksumSHA256") or "").split("-")[0]  # AWS appends "-<parts>"
            if stored != recorded:
                raise StorageError(
                    f"s3://{self.bucket}/{key}: the store's SHA-256 {stored or 'is missing'}, "
                    f"the local file's {recorded} (storage.verify_checksum = false skips this "
                    "for stores that record none)"
                )
        return FileEntry(path=path.name, size=size, sha256=sha256)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            f"put s3://{self.bucket}/{key}",
            self.client.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ChecksumAlgorithm="SHA256",
        )

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such key."""
        from botocore.exceptions import ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise StorageError(f"get s3://{self.bucket}/{key}: {e}") from e
        return self._call(f"read s3://{self.bucket}/{key}", response["Body"].read)

    def listing(self, prefix: str) -> dict[str, int]:
        """Key -> size of every object under `prefix`."""
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(
            f"list s3://{self.bucket}/{prefix}",
            lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=prefix)),
        )
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # the API's batch limit
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self._call(
                f"delete {len(batch)} objects from s3://{self.bucket}",
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": batch, "Quiet": True},
            )

    # ---- artifacts (a directory and its manifest) ------------------------------------------

    def upload_artifact(
        self,
        local_dir: Path,
        directory: str,
        *,
        kind: str,
        step: int,
        progress: Callable[[str, int], None] | None = None,
    ) -> Manifest:
        """Every file of `local_dir` (flat) under the key prefix `directory`, each verified,
        then the manifest: from that moment the artifact is complete. `progress(name,
        num_bytes)` is called as bytes of a file go out."""
        names = upload_order(p.name for p in local_dir.iterdir() if p.is_file())
        entries = tuple(
            self.upload_file(
                local_dir / name,
                directory + name,
                progress=None if progress is None else functools.partial(progress, name),
            )
            for name in names
        )
        manifest = Manifest(kind=kind, step=step, files=entries)
        self.put_bytes(directory + MANIFEST, manifest.to_json().encode())
        return manifest

    def read_manifest(self, directory: str) -> Manifest | None:
        data = self.get_bytes(directory + MANIFEST)
        return None if data is None else Manifest.from_json(data.decode())

    def artifacts(self, layout: RunLayout, kind: str) -> tuple[list[int], list[int]]:
        """(complete steps, incomplete steps) of `kind` in the bucket, ascending."""
        listing = self.listing(layout.kind_root(kind))
        complete, incomplete = [], []
        for step, directory in sorted(steps_in_listing(listing, layout, kind).items()):
            if directory + MANIFEST in listing and is_complete(
                self.read_manifest(directory), directory, listing
            ):
                complete.append(step)
            else:
                incomplete.append(step)
        return complete, incomplete

    def download_artifact(self, directory: str, local_dir: Path) -> Manifest:
        """Download a complete artifact into `local_dir`, each file checked against the
        manifest; the local marker last, so an interrupted download is no checkpoint."""
        manifest = self.read_manifest(directory)
        if manifest is None:
            raise StorageError(f"s3://{self.bucket}/{directory} has no {MANIFEST}: incomplete")
        local_dir.mkdir(parents=True, exist_ok=True)
        entries = {f.path: f for f in manifest.files}
        for name in upload_order(entries):
            entry, target = entries[name], local_dir / name
            if target.is_file() and target.stat().st_size == entry.size:
                if file_digests(target, None)[0] == entry.sha256:
                    continue  # already here (an earlier, interrupted download)
            partial = self.download_file(directory + name, target.with_name(target.name + ".part"))
            if file_digests(partial, None)[0] != entry.sha256:
                partial.unlink()
                raise StorageError(f"s3://{self.bucket}/{directory}{name}: SHA-256 mismatch")
            partial.replace(target)
        return manifest

    def download_file(self, key: str, target: Path) -> Path:
        """One object into `target` (parts in parallel for a large one); returns `target`."""
        self._call(
            f"download s3://{self.bucket}/{key}",
            self.client.download_file,
            self.bucket,
            key,
            str(target),
            Config=self.transfer,
        )
        return target

    def delete_artifact(self, directory: str) -> None:
        """Manifest first: a prune cut short leaves an incomplete directory, never a
        complete-looking one with files missing."""
        self.delete_keys([directory + MANIFEST])
        self.delete_keys(sorted(self.listing(directory)))


def timed_upload(store: ObjectStore, local_dir: Path, directory: str, *, kind: str, step: int):
    """`upload_artifact`, logged with its size and rate; returns (manifest, seconds)."""
    started = time.monotonic()
    manifest = store.upload_artifact(local_dir, directory, kind=kind, step=step)
    seconds = time.monotonic() - started
    log.info(
        "uploaded %s %d: %d files, %.1f MB in %.2fs (%.1f MB/s) to s3://%s/%s",
        kind,
        step,
        len(manifest.files),
        manifest.num_bytes / 1e6,
        seconds,
        manifest.num_bytes / 1e6 / max(seconds, 1e-9),
        store.bucket,
        directory,
    )
    return manifest, seconds
