"""The engine's side of LoRA rounds (inside vLLM's worker, or the actor's vLLM client):
with vLLM's LoRA on, an adapter directory per version for `add_lora` into one slot reloaded
in place; with it off, the adapter merged into the base weights and the model reloaded
(weights/formats/adapter.py holds the format and the merge)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weights.formats.adapter import (
    ADAPTER_SLOT,
    AdapterSnapshotWriter,
    merged_weights,
    scaling,
    unknown_modules,
)

if TYPE_CHECKING:
    import torch


def adapter_request(version: int, path: str | Path, *, reload: bool):
    """vLLM's LoRARequest of version `version`'s adapter at `path`: `reload` (for
    `add_lora`) replaces what the slot holds; requests carry it with `reload` False."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(
        lora_name=f"tether-v{version}",
        lora_int_id=ADAPTER_SLOT,
        lora_path=str(path),
        load_inplace=reload,
    )


def apply_adapter(
    worker: Any,
    weights: Iterable[tuple[str, torch.Tensor]],
    adapter_config: dict[str, Any],
    *,
    version: int,
    track: bool,
) -> dict[str, Any]:
    """Inside a vLLM worker (`worker` is the `WeightSyncExtension`): with vLLM's LoRA on,
    write the adapter as a PEFT directory for the client's `add_lora` (worker rank 0 writes,
    every worker reads it) and return its `adapter_path`; with it off, merge the adapter into
    the base weights and reload them (the whole model: the stall of a full update). Returns
    `num_bytes`: the adapter's bytes."""
    adapter = {name: tensor.detach().cpu().contiguous() for name, tensor in weights}
    num_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    if worker.vllm_config.lora_config is not None:
        path = ""
        if worker.rank == 0:
            path = str(_adapter_dirs(worker).write(version, adapter, adapter_config))
        return {"num_bytes": num_bytes, "adapter_path": path}
    base = _base_weights(worker)
    unknown = unknown_modules(adapter, (name for name, _ in base))
    if unknown:
        raise ValueError(f"adapter weights for modules the engine's model lacks: {unknown[:3]}")
    worker._tether_reload(merged_weights(base, adapter, scaling(adapter_config)), track)
    return {"num_bytes": num_bytes, "adapter_path": ""}


def _base_weights(worker: Any) -> list[tuple[str, torch.Tensor]]:
    """The engine's initial weights (its model directory), read once and kept in host
    memory: every merge starts from them."""
    from weights.formats.snapshot import safetensors_weights

    if not hasattr(worker, "_tether_base_weights"):
        model_dir = worker.vllm_config.model_config.model
        worker._tether_base_weights = list(safetensors_weights(model_dir))
    return worker._tether_base_weights


class AdapterDirs:
    """A worker's adapter directories, `<tmp>/v<version>/`: the newest two are kept (the
    slot's current adapter and the one before it), older ones deleted."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tether-adapters-"))
        self._written: list[Path] = []

    def write(self, version: int, adapter: dict, adapter_config: dict[str, Any]) -> Path:
        writer = AdapterSnapshotWriter(self.root, version, adapter_config)
        for name, tensor in adapter.items():
            writer.add(name, tensor)
        path = writer.finish()
        self._written = [p for p in self._written if p != path] + [path]
        while len(self._written) > 2:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        return path

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _adapter_dirs(worker: Any) -> AdapterDirs:
    if not hasattr(worker, "_tether_adapter_dirs"):
        worker._tether_adapter_dirs = AdapterDirs()
    return worker._tether_adapter_dirs
