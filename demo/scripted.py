"""A real tiny model taught to follow a script, for integration tests and benchmarks.

The random tiny model never writes `<tool_call>`, so real vLLM on it cannot drive a
multi-turn episode. A few seconds of supervised steps (demo.sft: loss on assistant tokens,
sequences built exactly as the actor builds them) on a handful of scripted conversations
make it play them: it still samples, so it strays now and then, as a policy does. The
result is saved as a full model directory (weights, config, tokenizer) that an engine can
start from or load as a snapshot, and that transformers can load as the reference.

`tests/fakes.py`'s ScriptedEngine scripts the engine; this scripts the weights, so everything
below them (vLLM, the prefix cache, logprobs) is the real thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def teach_script(
    base_dir: str | Path,
    conversations: list[list[dict[str, Any]]],
    out_dir: str | Path,
    *,
    tools: list[dict[str, Any]] | None = None,
    num_steps: int = 40,
    peak_lr: float = 3e-3,
    seed: int = 0,
) -> Path:
    """Train the model in `base_dir` on `conversations` (chat messages; loss on the
    assistant turns, `tools` rendered into the system turn) and save it to `out_dir`.
    Deterministic for a given seed. Returns `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from demo.sft import encode_conversation, train_sft

    if not conversations:
        raise ValueError("teach_script needs at least one conversation")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    examples = [encode_conversation(tokenizer, c, tools) for c in conversations]
    threads = torch.get_num_threads()
    # One thread: a ~0.1 s step on the tiny model; two threads on a shared, busy 2-core
    # machine were measured at 0.5-7 s per step (OpenMP threads waiting on each other).
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
            train_sft(
                model,
                examples,
                pad_id=tokenizer.pad_token_id,
                num_steps=num_steps,
                batch_size=len(examples),
                peak_lr=peak_lr,
                warmup_steps=min(5, num_steps),
                seed=seed,
            )
    finally:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)
    return out
