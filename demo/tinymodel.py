"""The tiny Qwen2 model and tokenizer that tests and the demo run on: shipped, and rebuilt
on demand.

No model can be downloaded here, so Tether makes its own: a byte-level BPE tokenizer trained
on the calculator task (demo/tokenizer.py), a ~0.9M-parameter Qwen2ForCausalLM
(4 layers, hidden 128, 4 heads of head_dim 32, fp32, tied embeddings), and a supervised warm
start on tool-use demonstrations (demo/sft.py) in two stages — tool calls only, to learn
the format and to copy numbers, then a mix with wrong guesses — that lands sampled pass@1
between never and always right, so RL has something to learn: calling the tool.

The warm-started model is SHIPPED in the repository (`demo/tiny_model/`, 3.7 MB, version in
its `tether_build.json`): floats differ between CPU types and thread counts, so the same
seeded recipe builds a different model on each machine (one copied operands wrong in a
fifth of its tool calls and plateaued lower under RL); shipping it makes `make run` start
from the same weights everywhere, minutes sooner. The recipe still builds it:
`--rebuild` trains a new one from the tool specs a live env server hands out (fetched over
gRPC, demo/env_tools.py) and a test checks that a rebuild still lands in the band.

Builds go under `<cache root>/tiny-qwen2-<hash>` (the hash covers the recipe, the builder's
source and the tool specs), written in a temporary directory and renamed into place under a
file lock. The cache root is `$TETHER_CACHE/tinymodel` or `<repo>/.cache/tinymodel`. The
random-weight variant (tests) reuses the shipped tokenizer and takes seconds.

    python -m demo.tinymodel                    # prints the shipped model directory
    python -m demo.tinymodel --no-warmstart     # random weights, same tokenizer (cached build)
    python -m demo.tinymodel --rebuild [--out DIR] [--seed N] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pydantic

from common.config import StrictModel
from demo import SHIPPED_MODEL_DIR

_REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS_FILE = "tools.json"
# The modules whose source decides what a build produces.
_BUILDER_MODULES = ("tinymodel", "tokenizer", "chat_template", "data", "sft")
BUILD_INFO = "tether_build.json"
ProgressLog = Callable[[int, float, int], None]


class TinyModelRecipe(StrictModel):
    """Everything that decides a tiny model build (its hash names the cache entry)."""

    seed: int = 0
    """Seed of the tokenizer corpus, the weight init, the demonstrations and batch order."""
    vocab_size: int = 512
    """Upper bound of the tokenizer's vocabulary (BPE stops earlier when the corpus runs out
    of pairs; the model's vocab_size is the tokenizer's actual size)."""
    tokenizer_conversations: int = 2000
    """Number of rendered demo conversations the BPE is trained on."""
    num_layers: int = 4
    """Transformer blocks."""
    hidden_size: int = 128
    """Model width."""
    num_heads: int = 4
    """Attention heads (and KV heads); head_dim = hidden_size / num_heads must be >= 32 for
    vLLM's CPU attention. Four heads learn to copy numbers faster than two."""
    intermediate_size: int = 384
    """MLP width."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt plus all turns) the model accepts."""
    sft_steps: int = 800
    """Warm-start steps on demonstrations that all call `add`: the model learns the format
    and to copy operands and results (mixed in from the start, random guesses drown that
    signal: copying then takes twice the steps). 0 leaves the model at its random init."""
    mix_steps: int = 200
    """Then steps on demonstrations of which only `tool_fraction` call the tool (the rest
    guess a wrong number): this sets how often the model calls the tool when RL starts."""
    sft_batch_size: int = 32
    """Conversations per warm-start step."""
    sft_lr: float = 3e-3
    """Peak learning rate of the tool-only stage (linear warmup, cosine decay to 10%)."""
    mix_lr: float = 1e-3
    """Peak learning rate of the mixed stage (same schedule)."""
    sft_warmup_steps: int = 50
    """Warmup steps of each stage's learning-rate schedule."""
    tool_fraction: float = 0.5
    """Fraction of the mixed stage's demonstrations that call `add` and copy its result."""
    num_threads: int = 2
    """torch threads used while building (the machines are shared 2-core boxes)."""

    @pydantic.model_validator(mode="after")
    def _check(self) -> TinyModelRecipe:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.hidden_size // self.num_heads < 32:
            raise ValueError("head_dim (hidden_size / num_heads) must be >= 32 for vLLM on CPU")
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError("tool_fraction must be in [0, 1]")
        return self


DEFAULT_RECIPE = TinyModelRecipe()


def default_cache_root() -> Path:
    env = os.environ.get("TETHER_CACHE")
    return (Path(env) if env else _REPO_ROOT / ".cache") / "tinymodel"


def recipe_hash(recipe: TinyModelRecipe, tools: list[dict]) -> str:
    """Hash of the recipe, the builder's source files and the tool specs it renders."""
    digest = hashlib.sha256(recipe.model_dump_json().encode())
    for name in _BUILDER_MODULES:
        digest.update((Path(__file__).parent / f"{name}.py").read_bytes())
    digest.update(json.dumps(tools).encode())
    return digest.hexdigest()[:16]


def qwen2_config(recipe: TinyModelRecipe, *, vocab_size: int, eos_id: int, pad_id: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        dtype="float32",
    )


def _build_into(
    directory: Path, recipe: TinyModelRecipe, tools: list[dict], log: ProgressLog | None
) -> dict:
    """Tokenizer (trained, or the shipped one for a random model), the model initialised
    from the recipe's seed, the warm start; everything saved into `directory`."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    from demo.chat_template import IM_END
    from demo.data import demonstrations
    from demo.sft import encode_conversation, train_sft
    from demo.tokenizer import build_tokenizer

    started = time.monotonic()
    if recipe.sft_steps == recipe.mix_steps == 0:
        tokenizer = AutoTokenizer.from_pretrained(SHIPPED_MODEL_DIR)
    else:
        tokenizer = build_tokenizer(
            tools=tools,
            vocab_size=recipe.vocab_size,
            num_conversations=recipe.tokenizer_conversations,
            seed=recipe.seed,
        )
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = qwen2_config(
        recipe, vocab_size=len(tokenizer), eos_id=eos_id, pad_id=tokenizer.pad_token_id
    )
    with torch.random.fork_rng():
        torch.manual_seed(recipe.seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
        losses: list[float] = []
        stages = [
            (recipe.sft_steps, 1.0, recipe.sft_lr),
            (recipe.mix_steps, recipe.tool_fraction, recipe.mix_lr),
        ]
        total_steps = sum(steps for steps, _, _ in stages)
        for stage, (num_steps, tool_fraction, peak_lr) in enumerate(stages):
            if num_steps == 0:
                continue
            conversations = demonstrations(
                num_steps * recipe.sft_batch_size,
                seed=recipe.seed + 1 + 10 * stage,
                tool_fraction=tool_fraction,
            )
            losses += train_sft(
                model,
                [encode_conversation(tokenizer, c, tools) for c in conversations],
                pad_id=tokenizer.pad_token_id,
                num_steps=num_steps,
                batch_size=recipe.sft_batch_size,
                peak_lr=peak_lr,
                warmup_steps=min(recipe.sft_warmup_steps, num_steps),
                seed=recipe.seed + 2 + 10 * stage,
                log=None if log is None else _offset_log(log, len(losses), total_steps),
            )
    model.eval()
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    (directory / TOOLS_FILE).write_text(json.dumps(tools, indent=2) + "\n")
    info = {
        "recipe": recipe.model_dump(),
        "hash": recipe_hash(recipe, tools),
        "num_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "build_seconds": round(time.monotonic() - started, 1),
        "final_sft_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
    }
    (directory / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def _offset_log(log: ProgressLog, offset: int, total_steps: int) -> Callable[[int, float], None]:
    """A stage's `log(step, loss)` as the build's `log(offset + step, loss, total_steps)`."""
    return lambda step, loss: log(offset + step, loss, total_steps)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another process may be building the same entry
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _print_progress(step: int, loss: float, num_steps: int) -> None:
    if step % 100 == 0 or step == num_steps - 1:
        print(f"warm start step {step}/{num_steps} loss {loss:.4f}", flush=True)


def build_tiny_model(
    out_dir: str | Path | None = None,
    *,
    tools: list[dict],
    recipe: TinyModelRecipe = DEFAULT_RECIPE,
    log: ProgressLog | None = _print_progress,
) -> Path:
    """The directory of the tiny model built by `recipe` with `tools` rendered into its
    prompts, under cache root `out_dir` (default: `default_cache_root()`); builds it only
    when no finished build exists. `log(step, loss, num_steps)` is called at every
    warm-start step (None: silent)."""
    import torch

    root = Path(out_dir) if out_dir is not None else default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"tiny-qwen2-{recipe_hash(recipe, tools)}"
    if (final / BUILD_INFO).is_file():
        return final
    with _locked(root / f".{final.name}.lock"):
        if (final / BUILD_INFO).is_file():
            return final
        # Scratch directories of this entry left by a build that was killed outright
        # (SIGKILL, SIGTERM): no one else can be using them while we hold the lock.
        for stale in root.glob(f".{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(min(threads, recipe.num_threads))
        scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            _build_into(scratch, recipe, tools, log)
            if final.exists():  # a half-written entry from an older builder without the lock
                shutil.rmtree(final)
            os.rename(scratch, final)
        finally:
            torch.set_num_threads(threads)
            shutil.rmtree(scratch, ignore_errors=True)
    return final


def shipped_model_dir() -> Path:
    """The warm-started model shipped in the repository (what `make run` starts RL from)."""
    if not (SHIPPED_MODEL_DIR / BUILD_INFO).is_file():
        raise FileNotFoundError(f"the shipped tiny model is missing from {SHIPPED_MODEL_DIR}")
    return SHIPPED_MODEL_DIR


def shipped_tools() -> list[dict]:
    """The tool specs the shipped model was trained on."""
    return json.loads((SHIPPED_MODEL_DIR / TOOLS_FILE).read_text())


def build_random_tiny_model(
    out_dir: str | Path | None = None, *, recipe: TinyModelRecipe = DEFAULT_RECIPE
) -> Path:
    """The shipped tokenizer and the recipe's architecture, random weights (no warm start):
    seconds to build."""
    return build_tiny_model(
        out_dir,
        tools=shipped_tools(),
        recipe=recipe.model_copy(update={"sft_steps": 0, "mix_steps": 0}),
    )


def rebuild_tiny_model(
    out_dir: str | Path | None = None,
    *,
    recipe: TinyModelRecipe = DEFAULT_RECIPE,
    log: ProgressLog | None = _print_progress,
) -> Path:
    """Build the warm-started model from scratch with the tool specs a live calculator env
    server hands out for a demo row (minutes a build); a seed whose build did not learn to
    copy operands is passed over for the next (demo/copy_check.py)."""
    from demo.copy_check import first_build_that_copies
    from demo.env_tools import fetch_demo_tools

    def build(trial: TinyModelRecipe, tools: list[dict]) -> Path:
        return build_tiny_model(out_dir, tools=tools, recipe=trial, log=log)

    return first_build_that_copies(build, fetch_demo_tools(), recipe)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m demo.tinymodel", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out",
        default=None,
        help="cache root of builds (default: $TETHER_CACHE/tinymodel or .cache/tinymodel)",
    )
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--no-warmstart", action="store_true", help="random weights, no SFT")
    choice.add_argument("--rebuild", action="store_true", help="train the warm start anew")
    parser.add_argument("--seed", type=int, default=DEFAULT_RECIPE.seed, help="recipe seed")
    parser.add_argument(
        "--threads", type=int, default=DEFAULT_RECIPE.num_threads, help="torch threads"
    )
    args = parser.parse_args(argv)
    recipe = DEFAULT_RECIPE.model_copy(update={"seed": args.seed, "num_threads": args.threads})
    if args.rebuild:
        print(rebuild_tiny_model(args.out, recipe=recipe))
    elif args.no_warmstart:
        print(build_random_tiny_model(args.out, recipe=recipe))
    else:
        print(shipped_model_dir())


if __name__ == "__main__":
    main()
