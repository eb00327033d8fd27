"""Run artifacts in an S3-compatible bucket: where each one goes, what marks it complete, and
which to keep, prune or resume from (pure: no I/O; `common/s3.py` does the moving).

    s3://<bucket>/<project>/<run>/
        global_step_<N>/              a DCP checkpoint (N = the learner's step, as the local
            __0_0.distcp ...            step_<N:08d>/ directory it was uploaded from)
            state.json
            manifest.json             written last: the completeness marker
        weights/global_step_<V>/      a weights snapshot of policy version V
            model.safetensors
            manifest.json
        weights/deltas/v<V>.delta     the weights log: version V as its change from V-1
                                      (weights/formats/delta_log.py; one object, its CRCs)
        evals/global_step_<V>/        eval trajectories and their aggregate (learner/eval_dump.py)
            <env_class>.jsonl
            aggregated_results.jsonl
        dispatcher.json               the learner's release write-ahead (learner/loop.py)

A checkpoint or snapshot is several objects, and no store offers a multi-object transaction;
so its `manifest.json` (every file's size and SHA-256) is uploaded only after every file it
lists has been uploaded and verified, and a reader counts it complete only when the manifest
is there *and* the listing shows every file with the size the manifest gives. A pruner
deletes the manifest first. Whatever interrupts an upload or a prune (SIGKILL included)
therefore leaves a directory that does not look complete, and the next prune sweeps it. An
eval file is one object: a PUT is atomic, so it needs no manifest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

MANIFEST = "manifest.json"
LOCAL_MARKER = "state.json"  # the local checkpoint's own marker (learner/trainer/checkpoint.py)
DISPATCHER_FILE = "dispatcher.json"
KINDS = ("checkpoint", "snapshot")
_STEP_DIR = re.compile(r"global_step_(\d+)/")


@dataclass(frozen=True)
class FileEntry:
    """One file of an artifact: its path inside the artifact's directory, size, SHA-256."""

    path: str
    size: int
    sha256: str  # hex


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint or snapshot holds."""

    kind: str
    step: int
    files: tuple[FileEntry, ...]

    def to_json(self) -> str:
        return json.dumps(
            {"kind": self.kind, "step": self.step, "files": [asdict(f) for f in self.files]},
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(
            kind=data["kind"],
            step=int(data["step"]),
            files=tuple(FileEntry(**f) for f in data["files"]),
        )

    @property
    def num_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class RunLayout:
    """Keys of one run's artifacts under `s3://<bucket>/<prefix>/` (`prefix` =
    `<project>/<run>`, no leading or trailing slash)."""

    bucket: str
    prefix: str

    def __post_init__(self) -> None:
        if not self.bucket or "/" in self.bucket:
            raise ValueError(f"bucket name {self.bucket!r} must be non-empty without '/'")
        if not self.prefix or self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ValueError(f"prefix {self.prefix!r} must be non-empty without outer '/'")

    def directory(self, kind: str, step: int) -> str:
        """The key prefix (ending in '/') of a checkpoint or snapshot."""
        if kind == "checkpoint":
            return f"{self.prefix}/global_step_{step}/"
        if kind == "snapshot":
            return f"{self.prefix}/weights/global_step_{step}/"
        raise ValueError(f"unknown artifact kind {kind!r}; one of {KINDS}")

    def kind_root(self, kind: str) -> str:
        """Where to list to find every artifact of `kind`."""
        return f"{self.prefix}/" if kind == "checkpoint" else f"{self.prefix}/weights/"

    @property
    def deltas_root(self) -> str:
        """Where the weights log's delta files go (`<deltas_root>v<version:06d>.delta`)."""
        return f"{self.prefix}/weights/deltas/"

    def delta_key(self, version: int) -> str:
        return f"{self.deltas_root}v{version:06d}.delta"  # weights/formats/delta_log.py delta_name

    def eval_key(self, version: int, file_name: str) -> str:
        return f"{self.prefix}/evals/global_step_{version}/{file_name}"

    @property
    def dispatcher_key(self) -> str:
        return f"{self.prefix}/{DISPATCHER_FILE}"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


def parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/key` -> ("bucket", "some/key")."""
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket")
    return bucket, key


def upload_order(paths: Iterable[str]) -> list[str]:
    """Data files first (sorted), then the local marker; the manifest is not among them (it
    is uploaded after all of these). A reader of the bucket trusts only the manifest, but
    keeping `state.json` last keeps a half-uploaded directory from even resembling a local
    checkpoint if someone copies it back by hand."""
    paths = [p for p in paths if p != MANIFEST]
    return sorted(p for p in paths if p != LOCAL_MARKER) + [p for p in paths if p == LOCAL_MARKER]


def steps_in_listing(listing: Mapping[str, int], layout: RunLayout, kind: str) -> dict[int, str]:
    """Step -> directory key of every artifact of `kind` that has any object in `listing`
    (key -> size of everything under `layout.kind_root(kind)`), complete or not."""
    root = layout.kind_root(kind)
    found: dict[int, str] = {}
    for key in listing:
        if not key.startswith(root):
            continue
        match = _STEP_DIR.match(key[len(root) :])
        if match:
            step = int(match.group(1))
            found[step] = layout.directory(kind, step)
    return found


def is_complete(manifest: Manifest | None, directory: str, listing: Mapping[str, int]) -> bool:
    """The manifest exists and every file it names is listed with the size it gives."""
    if manifest is None:
        return False
    return all(listing.get(directory + f.path) == f.size for f in manifest.files)


def prune_plan(complete: Iterable[int], incomplete: Iterable[int], keep: int | None) -> list[int]:
    """Steps to delete from the bucket: complete ones beyond the `keep` newest (None keeps
    all), and incomplete ones older than the newest complete one (left by an interrupted
    upload or prune; a newer incomplete one may be an upload in progress)."""
    complete = sorted(complete)
    newest = complete[-1] if complete else None
    doomed = [] if keep is None else complete[: max(len(complete) - keep, 0)]
    doomed += [s for s in incomplete if newest is not None and s < newest]
    return sorted(set(doomed))


def local_prune_plan(local: Iterable[int], uploaded: Iterable[int], keep: int) -> list[int]:
    """Local checkpoints to delete: all but the `keep` newest, never one that is not yet
    verified in the bucket (it may be the only copy)."""
    local = sorted(local)
    uploaded = set(uploaded)
    return [s for s in local[: max(len(local) - keep, 0)] if s in uploaded]


def resume_source(local: Iterable[int], remote: Iterable[int]) -> tuple[str, int] | None:
    """Where to resume from: ("local", step) or ("bucket", step), the newest complete
    checkpoint of either (a tie stays local: nothing to download); None when there is none."""
    newest_local = max(local, default=None)
    newest_remote = max(remote, default=None)
    if newest_local is None and newest_remote is None:
        return None
    if newest_remote is None or (newest_local is not None and newest_local >= newest_remote):
        return ("local", newest_local)
    return ("bucket", newest_remote)
