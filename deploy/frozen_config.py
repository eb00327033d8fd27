"""A run's configuration, written down once, resolved, when it starts: every section of the
user's file with every override applied (the launcher's wiring, the GPU placement, the
user's own), in `<run_dir>/config.yaml`. Every role is started from that file, so a process
restarted an hour later, or a whole run resumed, runs with what the run started with, even
if the file the user launched from was edited or deleted meanwhile. `--resume` overrides
are applied to it explicitly, recorded in `launch.json` and printed.

    sections = read_sections(user_file, wiring + overrides)
    digest = freeze(run_dir, sections)      # config.yaml, written atomically; its sha256
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml

FROZEN_FILE = "config.yaml"
HEADER = (
    "# This run's configuration, frozen when it started (deploy/frozen_config.py): every role\n"
    "# and every restart reads this file. Change a resumed run with overrides on --resume.\n"
)


def frozen_path(run_dir: Path) -> Path:
    return run_dir / FROZEN_FILE


def freeze(run_dir: Path, sections: dict[str, Any]) -> str:
    """Write `sections` as the run's config; returns the sha256 of what was written."""
    text = HEADER + yaml.safe_dump(sections, sort_keys=True)
    path = frozen_path(run_dir)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(text)
    os.replace(scratch, path)  # whole or not at all: a role starting now reads one or the other
    return hashlib.sha256(text.encode()).hexdigest()
