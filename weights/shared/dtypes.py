"""The learner's and the engine's dtypes, in one vocabulary, resolved and checked against
each other.

Both sections name dtypes as torch does (`float32`, `bfloat16`; the engine also `float16`),
and accept the short names `fp32`, `bf16`, `fp16`. The learner's `dtype` is its compute
dtype (`bfloat16` keeps fp32 master weights, FSDP2 mixed precision); the engine's is vLLM's.
`auto` is bfloat16 on GPU and float32 on CPU on both sides (float32 keeps vLLM's logprobs
equal to the learner's on the CPU tiny model; on GPU float32 would push vLLM off
FlashAttention onto a Triton kernel whose matmuls run in TF32, so engine and learner would
not agree either). The weights travel in the engine's dtype (bfloat16 to a bfloat16 engine:
half the bytes of float32), and a learner whose compute dtype differs from the engine's is
refused at start-up: the gap between the trainer's and the engine's logprobs on the same
tokens (`mismatch_kl`, learner/trainer/ppo_health.py) is then no longer rounding noise.
Pure: no torch.
"""

from __future__ import annotations

ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Short names accepted in configs for the torch names, which are what both sections keep."""
LEARNER_DTYPES = ("auto", "float32", "bfloat16")
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def canonical_dtype(setting: str) -> str:
    """The torch name of a configured dtype (`bf16` -> `bfloat16`); other values unchanged,
    for the config's own check to refuse."""
    return ALIASES.get(setting, setting)


def resolve_dtype(setting: str, *, on_gpu: bool) -> str:
    """A configured dtype (`auto` or a name) -> the torch dtype name it computes in: the
    learner's compute dtype, or the dtype vLLM is started with (never vLLM's own `auto`,
    the checkpoint's dtype: the learner must know the engine's)."""
    setting = canonical_dtype(setting)
    if setting not in ENGINE_DTYPES:
        raise ValueError(f"dtype must be one of {ENGINE_DTYPES}, got {setting!r}")
    if setting == "auto":
        return "bfloat16" if on_gpu else "float32"
    return setting


def dtype_mismatch(learner: str, engine: str) -> str | None:
    """None when the resolved dtypes agree; else the error that says what to change."""
    if learner == engine:
        return None
    return (
        f"the learner computes in {learner} but the engine runs in {engine}: the trainer's "
        "and the engine's logprobs of the same tokens would differ by more than rounding "
        f'(mismatch_kl). Set actor.engine.dtype = "{learner}"'
        + (
            f' or learner.dtype = "{engine}"'
            if engine in LEARNER_DTYPES
            else " (the learner computes in float32 or bfloat16 only)"
        )
        + " (or leave both at auto)"
    )


def lora_dtype_problem(dtype: str, *, enable_lora: bool, on_gpu: bool) -> str | None:
    """None when an engine of resolved `dtype` can run vLLM's LoRA; else the error. On CUDA
    vLLM's LoRA kernels (Triton, `lora_shrink`) take float16 and bfloat16 only: a float32
    engine with LoRA died at start with a bare AssertionError (H100, docs/gpu.md). On CPU
    float32 is what the tests run."""
    if not (enable_lora and on_gpu and dtype == "float32"):
        return None
    return (
        "actor.engine.enable_lora on a GPU needs a bfloat16 or float16 engine (vLLM's LoRA "
        'kernels on CUDA take no float32): set actor.engine.dtype = "bfloat16" and '
        'learner.dtype = "bfloat16" (or leave both at auto), or turn enable_lora off to merge '
        "each adapter into the base weights instead"
    )
