"""The `[storage]` config section: the S3-compatible bucket a run's artifacts go to.

Shared by the learner (uploads checkpoints, snapshots, eval dumps; resumes from the bucket)
and the actors (a replica that joins late downloads the announced snapshot). Credentials are
never in this file: boto3 reads them from the environment (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or a cluster's web-identity variables). Pure
pydantic: no boto3 import.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from common.config import StrictModel
from common.objectstore import RunLayout


class StorageConfig(StrictModel):
    """Object storage of run artifacts (docs/storage.md); off while `bucket` is None."""

    bucket: str | None = None
    """Bucket name; None keeps every artifact on local disk only."""
    project: str = "tether"
    """First path component under the bucket: s3://<bucket>/<project>/<run>/."""
    run: str | None = None
    """Second path component; None uses the run's broker namespace (`broker.namespace`)."""
    endpoint_url: str | None = None
    """S3 API endpoint for S3-compatible stores (MinIO, Ceph, R2, a test server); None is
    AWS's own endpoint for `region`."""
    region: str | None = None
    """AWS region; None takes AWS_REGION / AWS_DEFAULT_REGION from the environment."""
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """How the bucket goes into URLs; most self-hosted stores want "path"."""
    upload_checkpoints: bool = True
    """Upload every DCP checkpoint after it is saved."""
    upload_snapshots: bool = True
    """Upload weights snapshots, and announce the uploaded one to actors (s3:// URL)."""
    upload_evals: bool = True
    """Upload each eval's trajectory dump and aggregate."""
    keep_checkpoints: int | None = pydantic.Field(default=None, ge=1)
    """Complete checkpoints kept in the bucket (oldest deleted first); None keeps all."""
    keep_snapshots: int = pydantic.Field(default=2, ge=1)
    """Snapshots kept in the bucket (late joiners only ever need the newest)."""
    resume_from_bucket: bool = True
    """With `learner.checkpoint.resume`: if the bucket holds a newer complete checkpoint
    than the local disk, download it and resume from it."""
    verify_checksum: bool = True
    """After each upload, compare the SHA-256 the store recorded with the local file's (the
    size is always compared). False for stores that record no SHA-256 checksum."""
    multipart_chunk_mib: int = pydantic.Field(default=64, ge=5)
    """Files larger than this go up in parts of this size, several in parallel."""
    max_concurrency: int = pydantic.Field(default=4, ge=1)
    """Parallel part uploads and downloads of one file."""
    max_attempts: int = pydantic.Field(default=5, ge=1)
    """Tries of each S3 request (botocore's standard retry mode, with backoff)."""
    drain_timeout_s: float = pydantic.Field(default=600.0, ge=0)
    """At the learner's exit, how long to wait for queued uploads (the last checkpoint)."""
    cache_dir: str | None = None
    """Where actors put downloaded snapshots; None: a temporary directory per replica."""

    @property
    def enabled(self) -> bool:
        return self.bucket is not None

    def layout(self, default_run: str) -> RunLayout:
        """The key layout of this run (`default_run`: the broker namespace)."""
        if self.bucket is None:
            raise ValueError("storage.bucket is not set")
        return RunLayout(self.bucket, f"{self.project}/{self.run or default_run}")

    @pydantic.field_validator("project", "run")
    @classmethod
    def _path_component(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value or value in (".", "..")):
            raise ValueError(f"{value!r} must be one non-empty path component (no '/')")
        return value
