"""The pure rules of run artifacts in a bucket (common/objectstore.py): the key layout, the
manifest as completeness marker, what to prune and where to resume from."""

from __future__ import annotations

import base64
import hashlib

import pytest

from common.objectstore import (
    MANIFEST,
    FileEntry,
    Manifest,
    RunLayout,
    is_complete,
    local_prune_plan,
    parse_url,
    prune_plan,
    resume_source,
    steps_in_listing,
    upload_order,
)
from common.s3 import file_digests
from common.storage_config import StorageConfig

LAYOUT = RunLayout("bucket", "proj/run1")


def test_keys_follow_the_layout_users_analyse():
    assert LAYOUT.directory("checkpoint", 40) == "proj/run1/global_step_40/"
    assert LAYOUT.directory("snapshot", 7) == "proj/run1/weights/global_step_7/"
    assert (
        LAYOUT.eval_key(5, "calculator.jsonl") == "proj/run1/evals/global_step_5/calculator.jsonl"
    )
    assert LAYOUT.dispatcher_key == "proj/run1/dispatcher.json"
    assert LAYOUT.url("proj/run1/global_step_40/") == "s3://bucket/proj/run1/global_step_40/"
    assert parse_url("s3://bucket/proj/run1/weights/global_step_7/") == (
        "bucket",
        "proj/run1/weights/global_step_7/",
    )
    with pytest.raises(ValueError):
        parse_url("/local/path")
    with pytest.raises(ValueError):
        LAYOUT.directory("adapter", 1)


def test_the_run_defaults_to_the_broker_namespace():
    assert StorageConfig(bucket="b").layout("demo").prefix == "tether/demo"
    assert StorageConfig(bucket="b", project="p", run="r").layout("demo").prefix == "p/r"
    with pytest.raises(ValueError):
        StorageConfig(bucket="b", run="a/b")
    with pytest.raises(ValueError):
        StorageConfig().layout("demo")  # no bucket


def test_data_first_the_local_marker_last_the_manifest_not_at_all():
    names = ["state.json", "__1_0.distcp", MANIFEST, ".metadata", "__0_0.distcp"]
    assert upload_order(names) == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.json"]


def test_listing_finds_checkpoints_but_not_snapshots_evals_or_lookalikes():
    listing = {
        "proj/run1/global_step_4/__0_0.distcp": 10,
        "proj/run1/global_step_4/manifest.json": 1,
        "proj/run1/global_step_12/state.json": 3,
        "proj/run1/weights/global_step_10/model.safetensors": 99,
        "proj/run1/evals/global_step_10/calculator.jsonl": 5,
        "proj/run1/global_step_x/junk": 1,
        "proj/run1/dispatcher.json": 1,
    }
    assert steps_in_listing(listing, LAYOUT, "checkpoint") == {
        4: "proj/run1/global_step_4/",
        12: "proj/run1/global_step_12/",
    }
    weights = {k: v for k, v in listing.items() if k.startswith("proj/run1/weights/")}
    assert steps_in_listing(weights, LAYOUT, "snapshot") == {
        10: "proj/run1/weights/global_step_10/"
    }


def test_complete_means_manifest_and_every_file_at_its_size():
    directory = "proj/run1/global_step_4/"
    manifest = Manifest(
        kind="checkpoint",
        step=4,
        files=(FileEntry("a.distcp", 10, "x"), FileEntry("state.json", 3, "y")),
    )
    listing = {directory + "a.distcp": 10, directory + "state.json": 3, directory + MANIFEST: 9}
    assert is_complete(manifest, directory, listing)
    assert not is_complete(None, directory, listing)  # no manifest: an interrupted upload
    assert not is_complete(manifest, directory, {**listing, directory + "a.distcp": 7})
    del listing[directory + "state.json"]  # a prune that stopped half way
    assert not is_complete(manifest, directory, listing)
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.num_bytes == 13


def test_bucket_prune_keeps_the_newest_and_sweeps_old_debris():
    # complete 2, 4, 6, 8; incomplete 3 (an interrupted upload) and 10 (maybe in progress)
    assert prune_plan([2, 4, 6, 8], [3, 10], keep=2) == [2, 3, 4]
    assert prune_plan([2, 4, 6, 8], [3, 10], keep=None) == [3]
    assert prune_plan([2], [], keep=5) == []
    assert prune_plan([], [3], keep=1) == []  # nothing complete: the debris may be all there is


def test_local_prune_never_deletes_what_the_bucket_lacks():
    assert local_prune_plan([2, 4, 6], uploaded=[2, 4, 6], keep=1) == [2, 4]
    assert local_prune_plan([2, 4, 6], uploaded=[4, 6], keep=1) == [4]  # 2 failed to upload
    assert local_prune_plan([2, 4, 6], uploaded=[], keep=1) == []
    assert local_prune_plan([6], uploaded=[6], keep=1) == []


def test_resume_from_the_newest_complete_of_disk_and_bucket():
    assert resume_source([], []) is None
    assert resume_source([], [4, 8]) == ("bucket", 8)  # a fresh machine
    assert resume_source([4], [8]) == ("bucket", 8)
    assert resume_source([8], [4, 8]) == ("local", 8)  # a tie downloads nothing
    assert resume_source([10], [8]) == ("local", 10)  # its upload never finished


def test_digests_match_hashlib_whole_and_by_parts(tmp_path):
    data = bytes(range(256)) * 100  # 25,600 bytes
    path = tmp_path / "f"
    path.write_bytes(data)
    whole = hashlib.sha256(data)
    assert file_digests(path, None) == (
        whole.hexdigest(),
        base64.b64encode(whole.digest()).decode(),
    )
    parts = [data[:10_000], data[10_000:20_000], data[20_000:]]
    composite = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()
    assert file_digests(path, 10_000) == (whole.hexdigest(), base64.b64encode(composite).decode())
    path.write_bytes(b"")
    assert file_digests(path, None)[0] == hashlib.sha256(b"").hexdigest()
