"""LoRA adapters on disk and by name: PEFT's adapter directory (`adapter_config.json` and
`adapter_model.safetensors`), PEFT's tensor names, and the merge of an adapter into base
weights. Read and written by the learner (snapshots, the merge command) and by the engine;
pure, or torch and safetensors inside functions.

Over the weight broadcast the learner sends the adapter's tensors only
(weights/learner_side/adapter.py), and each engine applies them as a vLLM LoRA adapter or,
without vLLM's LoRA, merged into its base weights (weights/engine_side/adapter.py). The same
rounds, communicator and bucket framing as full weights; only the payload and what the
engine does with it differ, and the store's `info` says which (`payload`, `adapter_config`).

    learner rank 0                                   engine worker (vllm_worker.py)
    adapter_parameters(model): the trainable         receive_weights(ticket, payload "lora")
      tensors, PEFT's names ── buckets (gloo/NCCL) ─►  vLLM LoRA on:  write <tmp>/v<N>/ as a
                                                          PEFT directory; the client then
                                                          add_lora(slot 1, load_inplace)
                                                        vLLM LoRA off: W + alpha/r * B @ A for
                                                          every adapted weight, reload all
    snapshots: AdapterSnapshotWriter (a PEFT         load_snapshot(adapter dir): the same two
      directory: adapter_config.json + weights)        ways, from disk

One adapter slot per engine, reloaded in place. A vLLM request is bound to its adapter's
int id for life: a new id per version would leave requests that run across an update on
the old adapter while vLLM labels their later tokens with the new version. So the int id
stays `ADAPTER_SLOT` and `load_inplace=True` forces the reload (without it vLLM keeps the
adapter it has under that id: the adapter never reaches the engine, verl #7495); each
version gets its own adapter name and directory, which vLLM's prefix cache hashes, so a
request admitted after an update never reuses KV of an older adapter.

Tensor names are PEFT's on-disk names (`base_model.model.<module>.lora_A.weight`), which
PEFT's `from_pretrained`, vLLM's LoRA loader and the merge below all read. torch, safetensors
and vLLM are imported inside functions: configs importing this package stay fast.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weights.formats.snapshot import SnapshotWriter

if TYPE_CHECKING:
    import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SLOT = 1
"""vLLM's int id of the policy's adapter in every engine (ids start at 1)."""
PEFT_PREFIX = "base_model.model."
ADAPTER_NAME = "default"
"""PEFT's name of the (only) adapter in the learner's model."""


def peft_name(trainer_name: str, adapter_name: str = ADAPTER_NAME) -> str:
    """The learner's parameter name -> PEFT's saved name:
    `model.layers.0.self_attn.q_proj.lora_A.default.weight` ->
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    parts = trainer_name.split(".")
    if len(parts) < 4 or parts[-3] not in ("lora_A", "lora_B") or parts[-2] != adapter_name:
        raise ValueError(
            f"{trainer_name} is trainable but not a LoRA A/B weight of adapter "
            f"{adapter_name!r}: with finetune.mode = 'lora' only the adapter may train"
        )
    return PEFT_PREFIX + ".".join(parts[:-2] + ["weight"])


def adapted_weight(name: str) -> tuple[str, str]:
    """PEFT's saved name -> (the base weight it adapts, "A" or "B"):
    `base_model.model.model.layers.0.mlp.up_proj.lora_B.weight` ->
    (`model.layers.0.mlp.up_proj.weight`, "B")."""
    parts = name.removeprefix(PEFT_PREFIX).split(".")
    if len(parts) < 3 or parts[-2] not in ("lora_A", "lora_B") or parts[-1] != "weight":
        raise ValueError(f"{name} is not a LoRA A/B weight (lora_A.weight / lora_B.weight)")
    return ".".join(parts[:-2] + ["weight"]), parts[-2][-1]


def scaling(adapter_config: dict[str, Any]) -> float:
    """PEFT's LoRA scale: alpha / r (alpha / sqrt(r) with rsLoRA)."""
    rank, alpha = adapter_config["r"], adapter_config["lora_alpha"]
    return alpha / rank**0.5 if adapter_config.get("use_rslora") else alpha / rank


def lora_pairs(adapter: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{base weight name: (A [r, in], B [out, r])}; ValueError when a half is missing."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapter.items():
        weight, half = adapted_weight(name)
        halves.setdefault(weight, {})[half] = tensor
    incomplete = sorted(w for w, h in halves.items() if set(h) != {"A", "B"})
    if incomplete:
        raise ValueError(f"adapter weights without their other half: {incomplete[:3]}")
    return {weight: (h["A"], h["B"]) for weight, h in halves.items()}


def merged_weights(
    base: Iterable[tuple[str, torch.Tensor]],
    adapter: dict[str, torch.Tensor],
    scale: float,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The base weights with every adapted one replaced by W + scale * B @ A (computed in
    float32, returned in W's dtype), as PEFT's `merge_and_unload` does. The caller checks
    beforehand that every adapted weight is in `base` (`unknown_modules`)."""
    import torch

    pairs = lora_pairs(adapter)
    for name, weight in base:
        pair = pairs.get(name)
        if pair is None:
            yield name, weight
            continue
        a, b = (t.to(device=weight.device, dtype=torch.float32) for t in pair)
        yield name, (weight.to(torch.float32) + scale * (b @ a)).to(weight.dtype)


def unknown_modules(adapter: dict[str, torch.Tensor], base_names: Iterable[str]) -> list[str]:
    """Adapted weights that the base model does not have (a wrong base or target)."""
    return sorted(set(lora_pairs(adapter)) - set(base_names))


def adapter_mismatch(adapter_config: dict[str, Any], max_lora_rank: int | None) -> str:
    """Why an engine loading adapters natively (`max_lora_rank` set) cannot take this
    adapter, or "" (an engine that merges takes any rank)."""
    if max_lora_rank is not None and adapter_config["r"] > max_lora_rank:
        return (
            f"the learner trains a LoRA adapter of rank {adapter_config['r']} but this "
            f"engine's max_lora_rank is {max_lora_rank}: raise actor.engine.max_lora_rank "
            "(or lower learner.finetune.rank)"
        )
    return ""


class AdapterSnapshotWriter(SnapshotWriter):
    """`<dir>/v<version:06d>/` as a PEFT adapter directory (`adapter_config.json` and one
    `adapter_model.safetensors`), which PEFT, vLLM and `load_snapshot` read. An adapter is
    small: it is held whole until `finish()`."""

    def __init__(self, snapshot_dir: Path, version: int, adapter_config: dict[str, Any]):
        super().__init__(snapshot_dir, version, shard_bytes=1 << 62)
        self.adapter_config = adapter_config

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self._shard:
            return
        save_file(self._shard, self._tmp / ADAPTER_WEIGHTS)
        (self._tmp / ADAPTER_CONFIG).write_text(json.dumps(self.adapter_config, indent=2))
        self.num_files, self._shard = 1, {}


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def read_adapter_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config, {PEFT name: tensor}) of a PEFT adapter directory."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise ValueError(f"{path} has no {ADAPTER_WEIGHTS}")
    return json.loads((path / ADAPTER_CONFIG).read_text()), load_file(path / ADAPTER_WEIGHTS)


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
