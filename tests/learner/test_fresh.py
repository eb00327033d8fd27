"""`learner --fresh` with a bucket (learner/fresh.py): refused while the run's key prefix holds
an earlier run's checkpoints, which the new run's would mix with; fine on an empty prefix or
without a bucket. Against a real S3 API (moto's server on loopback)."""

from __future__ import annotations

from common.s3 import ObjectStore
from common.storage_config import StorageConfig
from learner.fresh import bucket_problem


def test_fresh_is_refused_only_where_the_bucket_holds_checkpoints(s3_storage):
    storage = s3_storage()
    assert bucket_problem(StorageConfig(), "ns") is None  # no bucket
    assert bucket_problem(storage, "ns") is None  # nothing there yet

    layout = storage.layout("ns")
    store = ObjectStore(storage)
    store.put_bytes(layout.directory("checkpoint", 3) + "model.safetensors", b"weights")
    store.put_bytes(layout.directory("checkpoint", 7) + "model.safetensors", b"weights")
    problem = bucket_problem(storage, "ns")
    assert problem.startswith(f"--fresh: s3://{storage.bucket}/{layout.prefix}/ holds")
    assert "(steps 3-7)" in problem and "storage.run=NAME" in problem

    elsewhere = storage.model_copy(update={"run": "second-try"})
    assert bucket_problem(elsewhere, "ns") is None  # the way out the message names
    assert bucket_problem(storage, "other-namespace") is None
