"""The GPU kit (deploy/gpu_kit/, docs/gpu.md): what can go wrong with it before a GPU is lent,
checked here so a device call is never spent finding it.

- the shim gives vLLM 0.26's classes what the actor calls on 0.32, when (and only when) the
  module is imported, and leaves a vLLM that has them alone;
- the scripts parse, every carried wheel is pinned, and every test the device run names still
  exists (a renamed test would make pytest error out on the device)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "deploy" / "gpu_kit"


@pytest.fixture
def shim():
    module = importlib.import_module("deploy.gpu_kit.vllm026_shim")
    finders = [f for f in sys.meta_path if type(f).__name__ == "_PatchOnImport"]
    for finder in finders:
        sys.meta_path.remove(finder)  # imported here for its functions, not its import hook
    yield module


async def test_the_shim_adds_what_vllm_0_26_lacks_and_nothing_else(shim):
    old = types.SimpleNamespace(AsyncLLM=type("AsyncLLM", (), {}))
    shim._weight_version(old)
    engine = old.AsyncLLM()
    await engine.update_weight_version("7")
    assert engine.tether_shim_weight_version == "7"

    def own(self, version):
        return "vLLM's own"

    new = types.SimpleNamespace(AsyncLLM=type("AsyncLLM", (), {"update_weight_version": own}))
    shim._weight_version(new)
    assert new.AsyncLLM.update_weight_version is own

    outputs = types.SimpleNamespace(CompletionOutput=type("CompletionOutput", (), {}))
    shim._weight_versions(outputs)
    assert outputs.CompletionOutput.weight_versions is None


def test_the_shim_patches_a_module_when_it_is_imported(shim, tmp_path, monkeypatch):
    (tmp_path / "kit_shim_target.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(shim._PATCHES, "kit_shim_target", lambda m: setattr(m, "patched", 1))
    finder = shim._PatchOnImport()
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module("kit_shim_target")
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("kit_shim_target", None)
    assert module.patched == 1 and module.Thing


@pytest.mark.parametrize("script", ["pack.sh", "run.sh"])
def test_the_kit_scripts_parse(script):
    subprocess.run(["bash", "-n", str(KIT / script)], check=True)


def test_every_carried_wheel_is_pinned():
    lines = [
        line.strip()
        for line in (KIT / "wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "vllm==0.26.0" in lines
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", line) for line in lines)


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_the_device_run_names_exists():
    named = re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", (KIT / "run.sh").read_text())
    assert len(named) >= 6
    for path, name in named:
        assert (REPO / path).is_file(), path
        if name:
            assert name in _test_names(REPO / path), f"{path}::{name}"
