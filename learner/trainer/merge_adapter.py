"""`learner merge-adapter --checkpoint DIR --out DIR [--base MODEL]`: a LoRA run's adapter
merged into its base model, written as a full HF model directory (config, safetensors,
tokenizer) that transformers and vLLM load like any other.

The adapter comes from a LoRA checkpoint (DCP: the adapter's tensors and their optimizer
state; `adapter_config.json` names the base model) or from an adapter snapshot (a PEFT
directory the learner writes for late-joining actors). The merge is PEFT's own
(`merge_and_unload`): W + alpha / r * B @ A for every adapted weight.

The arguments are parsed before torch is imported: `--help` and a bad path answer at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from weights.formats.adapter import ADAPTER_CONFIG  # torch-free: the parse comes first


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="learner merge-adapter",
        description="Merge a LoRA run's adapter into its base model: a full HF model directory.",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a LoRA checkpoint (runs/checkpoints/step_N) or an adapter snapshot directory",
    )
    parser.add_argument("--out", required=True, help="directory for the merged model")
    parser.add_argument(
        "--base", default=None, help="base model directory (default: the one the adapter names)"
    )
    return parser.parse_args(argv)


def merge_main(argv: list[str]) -> int:
    args = parse_args(argv)
    source = Path(args.checkpoint)
    if not (source / ADAPTER_CONFIG).is_file():
        print(
            f"learner merge-adapter: {source} has no {ADAPTER_CONFIG}: not a LoRA checkpoint "
            "or adapter snapshot (finetune.mode = 'lora')",
            file=sys.stderr,
        )
        return 2
    adapter_config = json.loads((source / ADAPTER_CONFIG).read_text())
    base = args.base or adapter_config.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        print(f"learner merge-adapter: base model {base!r} not found; pass --base", file=sys.stderr)
        return 2
    out = merge_adapter(source, Path(base), Path(args.out))
    print(f"merged {source} into {base}: {out}")
    return 0


def merge_adapter(source: Path, base: Path, out: Path) -> Path:
    """Write `base` + the adapter of `source` (checkpoint or snapshot) to `out`."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = LoraConfig.from_pretrained(str(source))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), config)
    set_peft_model_state_dict(model, _adapter_tensors(source, model))
    merged = model.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def _adapter_tensors(source: Path, peft_model) -> dict:
    """{PEFT's saved name: tensor} of the adapter in `source`."""
    import torch.distributed.checkpoint as dcp

    from weights.formats.adapter import PEFT_PREFIX, is_adapter_dir, peft_name, read_adapter_dir

    if is_adapter_dir(source) and any(source.glob("*.safetensors")):
        return read_adapter_dir(source)[1]
    # A DCP checkpoint: its model entries are the learner's parameter names (PeftModel's
    # without the `base_model.model.` prefix); load them into tensors of the right shapes.
    state = {
        name.removeprefix(PEFT_PREFIX): param.detach().clone()
        for name, param in peft_model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }
    if not state:
        raise ValueError(f"{source}: the adapter config adapts no module of the base model")
    dcp.load({"model": state}, checkpoint_id=source, no_dist=True)
    return {peft_name(name): tensor for name, tensor in state.items()}
