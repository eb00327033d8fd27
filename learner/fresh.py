"""`learner --fresh`: start a new run where an earlier one left its checkpoints.

A learner resumes the newest checkpoint (and the write-ahead `dispatcher.json`) in
`learner.checkpoint.dir` by default. `--fresh` turns that off (`learner.checkpoint.resume =
false`, so the run gets a new run id: learner/releases.py `start_run`) and moves what the
earlier run left there aside, to `<dir>.earlier-<time>`: nothing is deleted, and the new
run's checkpoints never mix with the old one's (a later resume takes the newest step
directory, whichever run wrote it).

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
