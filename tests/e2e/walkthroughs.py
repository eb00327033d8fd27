"""docs/running.md's walkthroughs, run as a new user runs them: the files of a section
written out, its commands run from that directory with Tether's virtual environment first on
PATH and nothing of ours on PYTHONPATH."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def walkthrough(section: str) -> str:
    """The text of docs/running.md's `section` (its heading line, as written)."""
    text = (REPO / "docs" / "running.md").read_text()
    assert section in text, f"docs/running.md lost its section {section!r}"
    return text.split(section, 1)[1].split("\n## ", 1)[0]


def walkthrough_files(section: str) -> dict[str, str]:
    """{path: text} of the section's code blocks marked ```LANG file=PATH."""
    return {
        match.group(1): match.group(2)
        for match in re.finditer(r"```\w+ file=(\S+)\n(.*?)```", section, re.S)
    }


def run_as_user(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)  # what `source .venv/bin/activate` puts first
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of ours on it
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", WANDB_MODE="disabled")
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def write_walkthrough(heading: str, commands: list[str], home: Path) -> None:
    """The files of the section under `heading` written under `home`, as a user copies
    them; fails when the section no longer says one of `commands`."""
    section = walkthrough(heading)
    for command in commands:
        assert command in section, f"the walkthrough no longer says {command!r}"
    for path, text in walkthrough_files(section).items():
        (home / path).parent.mkdir(parents=True, exist_ok=True)
        (home / path).write_text(text)


@contextlib.contextmanager
def installed(package: str, home: Path):
    """`pip install -e ./PACKAGE` from `home` into this virtual environment for the block,
    uninstalled after it; the block must change no file of Tether."""
    before = git_status()
    # --no-build-isolation: the venv's setuptools builds it, with no index to reach.
    pip = [sys.executable, "-m", "pip"]
    install = run_as_user([*pip, "install", "-q", "--no-build-isolation", "-e", f"./{package}"],
                          home, 300)  # fmt: skip
    assert install.returncode == 0, install.stderr
    try:
        yield
    finally:
        run_as_user([*pip, "uninstall", "-q", "-y", package], home, 120)
    assert git_status() == before, "the walkthrough changed a file of Tether"
