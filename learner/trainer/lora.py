"""LoRA on the learner (`learner.finetune.mode = "lora"`): PEFT's LoRA layers injected into
the HF model in place (`peft.inject_adapter_in_model`), the base weights frozen.

The model stays the transformers class it was (`Qwen2ForCausalLM`), so everything built
around it works unchanged: FSDP2 shards its decoder layers (the frozen base and the adapter
alike; only the adapter has gradients and optimizer state), attention still goes through
the registered segment attention (PEFT wraps linear layers, not attention), and logits are
still taken at the loss tokens only. Parameter names gain PEFT's `base_layer` /
`lora_A.default` / `lora_B.default` parts; what leaves the learner (weight rounds,
snapshots, the merge command) uses PEFT's saved names (weights/formats/adapter.py).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from learner.trainer.config import FinetuneConfig
from weights.formats.adapter import ADAPTER_CONFIG, ADAPTER_NAME


def peft_lora_config(finetune: FinetuneConfig):
    """PEFT's `LoraConfig` of the `[learner.finetune]` section."""
    from peft import LoraConfig

    return LoraConfig(
        r=finetune.rank,
        lora_alpha=finetune.alpha,
        lora_dropout=finetune.dropout,
        target_modules=list(finetune.target_modules),
        bias="none",
    )


def adapter_config(finetune: FinetuneConfig, base_model_path: str) -> dict[str, Any]:
    """The adapter's `adapter_config.json` as PEFT writes it (sets as lists), naming its
    base model: what engines, snapshots and checkpoints carry with the adapter's tensors."""
    config = peft_lora_config(finetune)
    config.base_model_name_or_path = str(base_model_path)
    config.inference_mode = True
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}


def has_adapter(model: torch.nn.Module) -> bool:
    return any(f".lora_A.{ADAPTER_NAME}." in name for name, _ in model.named_parameters())


def add_lora(model: torch.nn.Module, finetune: FinetuneConfig) -> torch.nn.Module:
    """Inject the adapter into `model` in place (on its device, or on meta for a model built
    there) and freeze everything else. PEFT initialises A (Kaiming-uniform) and B (zeros),
    so the adapted model starts equal to the base."""
    from peft import inject_adapter_in_model

    # PEFT raises a ValueError naming them when no target module matches.
    return inject_adapter_in_model(peft_lora_config(finetune), model, ADAPTER_NAME)


def with_adapter(model: torch.nn.Module, config) -> torch.nn.Module:
    """The policy of a LoRA run (`config` a `LearnerConfig`): `model` as built with its
    adapter (learner.trainer.model_init.load_model), or a plain model with one injected now."""
    if has_adapter(model):
        return model
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError("a sharded model gets its adapter before sharding: load_model(finetune=)")
    return add_lora(model, config.finetune)


def with_adapter_config(config) -> dict[str, Any]:
    """`adapter_config` of a `LearnerConfig`."""
    return adapter_config(config.finetune, config.model_path)


def adapter_files(adapter_config: dict[str, Any] | None) -> dict[str, str]:
    """The files a LoRA checkpoint holds besides DCP's: its adapter_config.json."""
    if adapter_config is None:
        return {}
    return {ADAPTER_CONFIG: json.dumps(adapter_config, indent=2)}
