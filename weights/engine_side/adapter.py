"""The engine's side of LoRA rounds (inside vLLM's worker, or the actor's vLLM client):
with vLLM's LoRA on, an adapter directory per version for `add_lora` into one slot reloaded
in place; with it off, the adapter merged into the base weights and the model reloaded
(weights/formats/adapter.py holds the format and the merge)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weights.engine_side.loading import reload
from weights.engine_side.state import worker_state
from weights.formats.adapter import (
    ADAPTER_SLOT,
    AdapterDirs,
    merged_weights,
    scaling,
    unknown_modules,
)
from weights.formats.snapshot import safetensors_weights

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
) -> tuple[int, str]:
    """Inside a vLLM worker (`worker` is the `WeightSyncExtension`): with vLLM's LoRA on,
    write the adapter as a PEFT directory for the client's `add_lora` (worker rank 0 writes,
    every worker reads it); with it off, merge the adapter into the base weights and reload
    them (the whole model: the stall of a full update). Returns the adapter's bytes and the
    directory written ("" when merged, or on the other ranks)."""
    adapter = {name: tensor.detach().cpu().contiguous() for name, tensor in weights}
    num_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    state = worker_state(worker)
    if worker.vllm_config.lora_config is not None:
        if worker.rank != 0:
            return num_bytes, ""
        if state.adapter_dirs is None:
            state.adapter_dirs = AdapterDirs()
        return num_bytes, str(state.adapter_dirs.write(version, adapter, adapter_config))
    if state.base_weights is None:  # read once, kept in host memory: every merge starts there
        model_dir = worker.vllm_config.model_config.model
        state.base_weights = list(safetensors_weights(model_dir))
    base = state.base_weights
    unknown = unknown_modules(adapter, (name for name, _ in base))
    if unknown:
        raise ValueError(f"adapter weights for modules the engine's model lacks: {unknown[:3]}")
    reload(worker, merged_weights(base, adapter, scaling(adapter_config)), track)
    return num_bytes, ""
