"""`learner --fresh`: start a new run where an earlier one left its checkpoints.

A learner resumes the newest checkpoint (and the write-ahead `dispatcher.json`) in
`learner.checkpoint.dir` by default. `--fresh` turns that off (`learner.checkpoint.resume =
false`, so the run gets a new run id: learner/releases.py `start_run`) and moves what the
earlier run left there aside, to `<dir>.earlier-<time>`: nothing is deleted, and the new
run's checkpoints never mix with the old one's (a later resume takes the newest step
directory, whichever run wrote it).

With a bucket (`[storage]`), the earlier run's uploaded checkpoints stay under the run's key
prefix, where the new run's would join them: the bucket keeps the newest by step and a later
resume downloads it, whichever run wrote it. So `--fresh` refuses while that prefix holds
checkpoints (`bucket_problem`), naming the two ways out; nothing is moved or deleted there.

Not for supervised command lines: a process restarted with `--fresh` starts over each time.
"""

from __future__ import annotations

import time
from pathlib import Path


def set_aside(checkpoint_dir: str | Path) -> Path | None:
    """Move a non-empty `checkpoint_dir` to `<dir>.earlier-<YYYYmmdd-HHMMSS>`; the new path,
    None when there was nothing to move."""
    source = Path(checkpoint_dir)
    if not source.is_dir() or not any(source.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = source.with_name(f"{source.name}.earlier-{stamp}")
    suffix = 1
    while target.exists():  # two fresh starts within a second
        target = source.with_name(f"{source.name}.earlier-{stamp}-{suffix}")
        suffix += 1
    source.rename(target)
    return target


def bucket_problem(storage, namespace: str) -> str | None:
    """Why `--fresh` cannot start with `storage` (a StorageConfig) for the run of broker
    namespace `namespace`: its bucket prefix holds an earlier run's checkpoints. None when
    there is no bucket or nothing there."""
    if not storage.enabled:
        return None
    from common.s3 import ObjectStore, StorageError

    layout = storage.layout(namespace)
    try:
        complete, incomplete = ObjectStore(storage).artifacts(layout, "checkpoint")
    except StorageError as e:
        return f"--fresh: cannot see what {layout.url(layout.prefix + '/')} holds: {e}"
    steps = sorted(complete + incomplete)
    if not steps:
        return None
    return (
        f"--fresh: {layout.url(layout.prefix + '/')} holds checkpoints of an earlier run "
        f"(steps {steps[0]}-{steps[-1]}), which the new run's would mix with (the newest is "
        "kept and resumed, whichever run wrote it): give the new run its own prefix "
        "(storage.run=NAME), or delete that prefix first"
    )
