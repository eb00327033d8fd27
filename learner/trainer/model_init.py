"""Building the learner's models on each rank: the device from LOCAL_RANK, and HF models
loaded sharded, never whole on every rank.

    single process:  from_pretrained(path) -> device
    FSDP2 (N ranks): every rank  meta-device model -> fully_shard -> to_empty(device)
                     rank 0      reads the checkpoint's safetensors on CPU
                     all ranks   set_model_state_dict(broadcast_from_rank0): rank 0 sends each
                                 tensor, every rank keeps its shard

So a rank holds its shard of the model (rank 0 also the checkpoint, in host memory) and the
reference model for the KL term is built the same way: no rank ever deep-copies a whole
model. With a LoRA adapter (learner/trainer/lora.py) every rank injects it into its meta model
before sharding, and rank 0 builds the full state it broadcasts from the checkpoint with
the adapter injected on CPU (PEFT's initialisation), so all ranks start from one adapter.
Non-persistent buffers (the rotary tables) are not in a checkpoint and the meta
device leaves them empty: they are recomputed by building their modules afresh.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from weights.shared.dtypes import resolve_dtype

log = logging.getLogger(__name__)


def select_device(local_rank: int, num_gpus: int) -> torch.device:
    """The device of the rank with `local_rank` on a node with `num_gpus` visible GPUs:
    cuda:<local_rank>, or CPU without GPUs. torchrun's LOCAL_RANK indexes the GPUs the
    launcher made visible (common/placement.py), one rank per GPU: NCCL refuses two ranks
    of one group on one GPU, so too few GPUs is an error here, not a silent GPU 0."""
    if num_gpus == 0:
        return torch.device("cpu")
    if not 0 <= local_rank < num_gpus:
        raise ValueError(
            f"learner rank with LOCAL_RANK={local_rank} has no GPU of its own: {num_gpus} "
            "visible (CUDA_VISIBLE_DEVICES); start at most that many ranks per node"
        )
    return torch.device("cuda", local_rank)


def default_device() -> torch.device:
    """This process's device: torchrun's LOCAL_RANK among the visible GPUs, else CPU.
    Counting GPUs does not initialise CUDA; `torch.cuda.set_device` on the result must come
    before anything else touches CUDA (else every rank's context lands on GPU 0)."""
    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return select_device(int(os.environ.get("LOCAL_RANK", "0")), num_gpus)


def compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The learner's compute dtype on `device` (`learner.dtype`, resolved as the engine's is:
    weights/shared/dtypes.py). The one place the learner works it out."""
    dtype = getattr(torch, resolve_dtype(setting, on_gpu=device.type == "cuda"))
    if dtype == torch.bfloat16 and device.type == "cpu" and not native_cpu_bf16():
        _say_bf16_is_emulated()
    return dtype


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): without, torch
    emulates it, and a bf16 matmul ran at a quarter of fp32's speed (Cascade Lake)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


@functools.cache
def _say_bf16_is_emulated() -> None:
    log.warning(
        "learner.dtype = bfloat16 on a CPU without native bf16 (no AVX512-BF16 or AMX): torch "
        "emulates its matmuls, several times slower than float32 here; float32 (auto) on "
        "both sides trains faster on this host"
    )


def shard(model: torch.nn.Module, *, bf16: bool, device: torch.device) -> torch.nn.Module:
    """FSDP2: each decoder layer its own group (all-gathered just in time), then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp_policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=torch.float32 if bf16 else None,
    )
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def load_model(
    path: str | Path, *, device: torch.device, bf16: bool = False, finetune=None
) -> torch.nn.Module:
    """The HF causal LM at `path`, fp32 master weights: whole on `device` in a single
    process, sharded over the ranks under torch.distributed (see the module docstring).
    `finetune` (a `FinetuneConfig` of mode "lora") injects a LoRA adapter."""
    from transformers import AutoConfig, AutoModelForCausalLM

    lora = finetune if finetune is not None and finetune.mode == "lora" else None
    if not dist.is_initialized() or dist.get_world_size() == 1:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return (_with_lora(model, lora) if lora else model).to(device)
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if lora:
        model = _with_lora(model, lora)
    model = shard(model, bf16=bf16, device=device)
    model.to_empty(device=device)
    _rebuild_non_persistent_buffers(model, device)
    _broadcast_checkpoint(model, path, lora)
    return model


def _with_lora(model: torch.nn.Module, finetune) -> torch.nn.Module:
    from learner.trainer.lora import add_lora

    return add_lora(model, finetune)


def _rank0_state(path: str | Path, lora) -> dict[str, torch.Tensor]:
    """What rank 0 broadcasts: the checkpoint's tensors, or with an adapter the state of
    the checkpoint's model with the adapter injected (base names gain `base_layer`)."""
    from weights.formats.snapshot import safetensors_weights

    if lora is None:
        return dict(safetensors_weights(path))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return dict(_with_lora(model, lora).state_dict())


def _broadcast_checkpoint(model: torch.nn.Module, path: str | Path, lora=None) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        full = _rank0_state(path, lora)
        # A tied checkpoint holds the embedding once; the model's state dict names both.
        for name, param in model.named_parameters(remove_duplicate=False):
            if name not in full:
                canonical = next(
                    (n for n, p in model.named_parameters() if p is param and n in full), None
                )
                if canonical is None:
                    raise ValueError(f"{path}: no tensor for parameter {name}")
                full[name] = full[canonical]
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)


def _rebuild_non_persistent_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Modules with non-persistent buffers (HF rotary embeddings) are built again from
    their config on `device` and their buffers copied over: after `to_empty` they hold
    uninitialised memory, and no checkpoint carries them."""
    for name, module in model.named_modules():
        buffers = [b for b in module._non_persistent_buffers_set if b in module._buffers]
        if not buffers:
            continue
        if not hasattr(module, "config"):
            raise ValueError(f"cannot rebuild the buffers {buffers} of {name} ({type(module)})")
        with torch.device(device):
            fresh = type(module)(module.config)
        for buffer in buffers:
            module._buffers[buffer] = getattr(fresh, buffer).to(device)
