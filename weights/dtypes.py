"""The learner's and the engine's dtypes, resolved and checked against each other.

The learner's `dtype` is its compute dtype (`bf16` keeps fp32 master weights, FSDP2 mixed
precision); the engine's is vLLM's. `auto` is bf16 on GPU and fp32 on CPU on both sides (fp32
keeps vLLM's logprobs equal to the learner's on the CPU tiny model; on GPU fp32 would push
vLLM off FlashAttention onto a Triton kernel whose matmuls run in TF32, so engine and
learner would not agree either). The weights travel in the engine's dtype (bf16 to a bf16
engine: half the bytes of fp32), and a learner whose compute dtype differs from the engine's
is refused at start-up: the gap between the trainer's and the engine's logprobs on the same
tokens (`mismatch_kl`, learner/health.py) is then no longer rounding noise. Pure: no torch.
"""

from __future__ import annotations

LEARNER_TO_TORCH = {"fp32": "float32", "bf16": "bfloat16"}
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_learner_dtype(setting: str, *, on_gpu: bool) -> str:
    """`auto`/`fp32`/`bf16` -> the torch dtype name the learner computes in."""
    if setting == "auto":
        return "bfloat16" if on_gpu else "float32"
    if setting not in LEARNER_TO_TORCH:
        raise ValueError(f"learner dtype must be auto, fp32 or bf16, got {setting!r}")
    return LEARNER_TO_TORCH[setting]


def resolve_engine_dtype(setting: str, *, on_gpu: bool) -> str:
    """`auto`/`float32`/`bfloat16`/`float16` -> the dtype vLLM is started with (never
    vLLM's own `auto`, the checkpoint's dtype: the learner must know the engine's)."""
    if setting not in ENGINE_DTYPES:
        raise ValueError(f"engine dtype must be one of {ENGINE_DTYPES}, got {setting!r}")
    if setting == "auto":
        return "bfloat16" if on_gpu else "float32"
    return setting


def dtype_mismatch(learner: str, engine: str) -> str | None:
    """None when the resolved dtypes agree; else the error that says what to change."""
    if learner == engine:
        return None
    back = {v: k for k, v in LEARNER_TO_TORCH.items()}
    return (
        f"the learner computes in {learner} but the engine runs in {engine}: the trainer's "
        "and the engine's logprobs of the same tokens would differ by more than rounding "
        "(mismatch_kl). Set actor.engine.dtype = "
        f'"{learner}" or learner.dtype = "{back.get(engine, engine)}"'
        + ("" if engine in back else " (the learner computes in fp32 or bf16 only)")
        + " (or leave both at auto)"
    )
