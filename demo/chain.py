"""A long-episode variant of the calculator task: "What is A + B + C + D?" with only the
two-operand `add` tool. Solving it takes one call per `+`, each adding the next operand to
the last result, then the answer: `terms` turns where the demo takes two, so an episode
with slow tools outlasts several weight updates and its first turn can be stale while its
last is fresh (what the learner's `token` staleness rule is for).

The rows are SkyRL rows for the `calculator` env (reward: the exact sum). The warm start
continues the shipped model, which already calls `add` once and copies its result, with
supervised chains: `chain_steps` on demonstrations that all chain, then `mix_steps` on
demonstrations of which `tool_fraction` chain and the rest guess a wrong number, so RL
starts between never and always right, as the demo does. Built once per recipe and cached.

    python -m demo.chain --out DIR [--terms 4]   # DIR/train.jsonl, DIR/eval.jsonl, DIR/model
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pydantic

from common.config import StrictModel
from demo import SHIPPED_MODEL_DIR
from demo.data import (
    DEMO_TOOL_NAMES,
    DEMO_TOOLS,
    NUMBER_LOW,
    SYSTEM_PROMPT,
    split_of,
    tool_call_text,
    write_jsonl,
)
from demo.tinymodel import default_cache_root


class ChainRecipe(StrictModel):
    """Everything that decides a chain warm start (its hash names the cache entry)."""

    terms: int = pydantic.Field(4, ge=2)
    """Operands per question: `terms - 1` calls, then the answer."""
    max_operand: int = 99
    """Operands are drawn from 10 to this: two digits, so that four of them and three
    running sums copied at temperature 1 still come out right often enough for RL to start
    from (with the demo's three digits a warm start's sampled pass@1 was 0.01)."""
    chain_steps: int = 800
    """Supervised steps on demonstrations that all chain their calls."""
    mix_steps: int = 150
    """Then steps on demonstrations of which `tool_fraction` chain (the rest guess)."""
    tool_fraction: float = 0.5
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0
    num_threads: int = 1


def task_key(terms: list[int]) -> str:
    return "calculator-chain-" + "-".join(map(str, terms))


def make_row(terms: list[int], *, split: str) -> dict[str, Any]:
    """One SkyRL row asking for the sum of `terms`."""
    question = " + ".join(map(str, terms))
    return {
        "data_source": "calculator_chain",
        "env_class": "calculator",
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"What is {question}?"},
        ],
        "reward_spec": {"method": "rule", "ground_truth": str(sum(terms))},
        "extra_info": {
            "task_key": task_key(terms),
            "split": split,
            "terms": terms,
            "tools": list(DEMO_TOOL_NAMES),
        },
    }


def sample_terms(num: int, recipe: ChainRecipe, *, seed: int, split: str) -> list[list[int]]:
    """`num` distinct operand lists of one split (by the MD5 of their task key)."""
    rng = random.Random(f"chain:{split}:{seed}")
    drawn: list[list[int]] = []
    seen: set[str] = set()
    while len(drawn) < num:
        operands = [rng.randint(NUMBER_LOW, recipe.max_operand) for _ in range(recipe.terms)]
        key = task_key(operands)
        if key not in seen and split_of(key) == split:
            seen.add(key)
            drawn.append(operands)
    return drawn


def make_rows(num: int, recipe: ChainRecipe, *, seed: int, split: str) -> list[dict[str, Any]]:
    return [make_row(t, split=split) for t in sample_terms(num, recipe, seed=seed, split=split)]


def demonstration(terms: list[int], *, chain: bool, rng: random.Random) -> list[dict[str, Any]]:
    """A whole conversation: add each operand to the last result and answer the sum, or
    guess a wrong number at once."""
    messages = make_row(terms, split="train")["prompt"]
    total = sum(terms)
    if not chain:
        # A range that holds a wrong number even when every operand is the smallest.
        low, high = len(terms) * NUMBER_LOW, max(len(terms) * max(terms), total + 1)
        guess = total
        while guess == total:
            guess = rng.randint(low, high)
        return messages + [{"role": "assistant", "content": f"<answer>{guess}</answer>"}]
    running = terms[0]
    for operand in terms[1:]:
        call = tool_call_text("add", {"a": running, "b": operand})
        running += operand
        messages += [{"role": "assistant", "content": call},
                     {"role": "tool", "content": str(running)}]  # fmt: skip
    return messages + [{"role": "assistant", "content": f"<answer>{total}</answer>"}]


def demonstrations(
    num: int, recipe: ChainRecipe, *, seed: int, tool_fraction: float
) -> list[list[dict]]:
    rng = random.Random(f"chain-demos:{seed}")
    return [demonstration(t, chain=rng.random() < tool_fraction, rng=rng)
            for t in sample_terms(num, recipe, seed=seed, split="train")]  # fmt: skip


DEFAULT_RECIPE = ChainRecipe()


def recipe_hash(recipe: ChainRecipe) -> str:
    """The recipe, the source of what the build trains on and how, and the shipped model it
    continues (a docstring edited elsewhere keeps the entry)."""
    digest = hashlib.sha256(recipe.model_dump_json().encode())
    for function in (make_row, sample_terms, demonstration, demonstrations, _train):
        digest.update(inspect.getsource(function).encode())
    for path in (Path(__file__).with_name("sft.py"), SHIPPED_MODEL_DIR / "model.safetensors"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _train(recipe: ChainRecipe, out_dir: Path) -> dict[str, Any]:
    """The shipped model continued on chain demonstrations, saved into `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from demo.sft import encode_conversation, train_sft

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_MODEL_DIR)
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    losses: list[float] = []
    try:
        with torch.random.fork_rng():
            torch.manual_seed(recipe.seed)
            model = AutoModelForCausalLM.from_pretrained(SHIPPED_MODEL_DIR, dtype=torch.float32)
            stages = ((recipe.chain_steps, 1.0), (recipe.mix_steps, recipe.tool_fraction))
            for stage, (num_steps, fraction) in enumerate(stages):
                conversations = demonstrations(
                    num_steps * recipe.batch_size,
                    recipe,
                    seed=recipe.seed + stage,
                    tool_fraction=fraction,
                )
                losses += train_sft(
                    model,
                    [encode_conversation(tokenizer, c, DEMO_TOOLS) for c in conversations],
                    pad_id=tokenizer.pad_token_id,
                    num_steps=num_steps,
                    batch_size=recipe.batch_size,
                    peak_lr=recipe.lr,
                    warmup_steps=min(20, num_steps),
                    seed=recipe.seed + 10 + stage,
                )
    finally:
        torch.set_num_threads(threads)
    model.eval()
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    for path in SHIPPED_MODEL_DIR.iterdir():  # tokenizer, template, tools: unchanged
        if (
            path.is_file()
            and not (out_dir / path.name).exists()
            and path.suffix == ".json"
            and path.name != "tether_build.json"
        ):
            shutil.copyfile(path, out_dir / path.name)
    info = {"recipe": recipe.model_dump(), "final_loss": sum(losses[-10:]) / 10,
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    (out_dir / "tether_chain.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def chain_model(recipe: ChainRecipe = DEFAULT_RECIPE, cache_root: Path | None = None) -> Path:
    """The warm-started model for `recipe`, built on first use (a minute or two)."""
    root = (cache_root or default_cache_root().parent) / "chain"
    directory = root / recipe_hash(recipe)
    if not (directory / "tether_chain.json").is_file():
        scratch = root / f".build-{directory.name}"
        shutil.rmtree(scratch, ignore_errors=True)
        _train(recipe, scratch)
        scratch.replace(directory)  # whole or absent: a killed build leaves only scratch
    return directory


def write_task(out_dir: Path, recipe: ChainRecipe = DEFAULT_RECIPE, *, num_train: int = 5000,
               num_eval: int = 100, seed: int = 0) -> dict[str, Path]:  # fmt: skip
    """The rows and the model a run of the chain task needs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = {split: make_rows(num, recipe, seed=seed, split=split)
            for split, num in (("train", num_train), ("eval", num_eval))}  # fmt: skip
    return {"train": write_jsonl(out_dir / "train.jsonl", rows["train"]),
            "eval": write_jsonl(out_dir / "eval.jsonl", rows["eval"]),
            "model": chain_model(recipe)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m demo.chain", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="where the rows go")
    parser.add_argument("--terms", type=int, default=ChainRecipe().terms)
    args = parser.parse_args(argv)
    try:
        recipe = ChainRecipe(terms=args.terms)
    except pydantic.ValidationError as e:
        parser.error(f"--terms {args.terms}: {e.errors()[0]['msg']}")
    for name, path in write_task(args.out, recipe).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
