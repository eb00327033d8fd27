"""A process that uploads one checkpoint directory to the bucket and stops half way through
its largest file, saying so on stdout: the test then kills it with SIGKILL.

    python -m tests.learner.s3_upload_victim CHECKPOINT_DIR STEP ENDPOINT BUCKET
(credentials from the environment, as always)
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from common.s3 import ObjectStore
from common.storage_config import StorageConfig

PAUSE_AFTER_BYTES = 1 << 20


def main() -> None:
    checkpoint, step, endpoint, bucket = sys.argv[1:5]
    storage = StorageConfig(
        bucket=bucket, endpoint_url=endpoint, run="killed", multipart_chunk_mib=5, max_concurrency=1
    )
    largest = max(Path(checkpoint).iterdir(), key=lambda p: p.stat().st_size).name
    sent: dict[str, int] = {}

    def progress(name: str, num_bytes: int) -> None:
        sent[name] = sent.get(name, 0) + num_bytes
        if name == largest and sent[name] >= PAUSE_AFTER_BYTES:
            print(f"PAUSED in {name} after {sent[name]} bytes", flush=True)
            threading.Event().wait()  # until SIGKILL

    store = ObjectStore(storage)
    layout = storage.layout("unused")
    store.upload_artifact(
        Path(checkpoint),
        layout.directory("checkpoint", int(step)),
        kind="checkpoint",
        step=int(step),
        progress=progress,
    )
    print("FINISHED (the test expected to kill this first)", flush=True)


if __name__ == "__main__":
    main()
