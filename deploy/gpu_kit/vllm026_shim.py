"""Lets the code written for vLLM 0.32 run on vLLM 0.26, whose CUDA wheel matches the torch
a lent GPU machine carries (2.11). In effect only in the GPU kit's run, never in a Tether
install: deploy/gpu_kit/run.sh imports it from a .pth file, so every Python process there,
a test's subprocess with its own PYTHONPATH included, has it.

vLLM 0.26 lacks two things 0.32 has and the actor uses:
- `AsyncLLM.update_weight_version(v)`: later engine steps are labelled v. Shimmed as a no-op.
- `CompletionOutput.weight_versions`: each token's version spans. Shimmed as None, which the
  actor already treats as "no spans": every token gets the version its request started at
  (right unless an update lands mid-request; the kit's tests update between requests).

The patch is applied when the module is first imported, in whatever process imports it,
so vLLM's own processes are untouched."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_PATCHES = {}


def _patch(name):
    def register(function):
        _PATCHES[name] = function
        return function

    return register


@_patch("vllm.v1.engine.async_llm")
def _weight_version(module) -> None:
    if hasattr(module.AsyncLLM, "update_weight_version"):
        return

    async def update_weight_version(self, version: str) -> None:
        self.tether_shim_weight_version = version

    module.AsyncLLM.update_weight_version = update_weight_version


@_patch("vllm.outputs")
def _weight_versions(module) -> None:
    if not hasattr(module.CompletionOutput, "weight_versions"):
        module.CompletionOutput.weight_versions = None


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
