"""A warm start for any task's rows: an imperfect starting policy for RL, made by supervised
training on a fraction of the task's own rows, solved.

A solved example is a row's prompt followed by the assistant turn `<answer>GROUND_TRUTH</answer>`
(the form `learner prepare --from reasoning_gym:TASK` asks for and `common/rows.py` rows carry);
it is tokenised as the actor will see it (demo/sft.py `encode_conversation`: loss on the answer
turn and its `<|im_end|>` only) and trained with demo/sft.py `train_sft`. Training stops at
`max_steps`, or earlier once the model's *expected* pass@1 on held-out rows reaches `stop_at`:

    expected pass@1 = mean over rows of p(<answer>TRUTH</answer><|im_end|> | prompt)

teacher-forced, one forward pass, no sampling and no environment: at temperature 1 it is the
chance that a sample is exactly the solution (a scorer that accepts other forms too can only
score higher). Stopping there leaves the policy well below its ceiling (`greedy` accuracy, also
reported, is what the same weights get when always taking the likeliest token), so RL has
something to improve.

The model starts from the shipped calculator model (`init = "shipped"`, the default: it already
writes `<answer>...</answer><|im_end|>` and knows digits, so a task needs a few hundred steps),
from random weights (`"random"`), or from any model directory (`--init DIR`: how bench/tasks.py
continues a warm start with plain SFT as RL's control). The tokenizer files are copied from the
start model byte for byte, so the tokenizer and chat template are unchanged.

    python -m demo.warmstart --rows data/train.jsonl --out DIR [--fraction F] [--max-steps N]
                             [--stop-at P] [--seed S] [--init shipped|random|DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic

from common.config import StrictModel

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BUILD_INFO = "tether_warmstart.json"
CLI_FIELDS = ("init", "fraction", "max_steps", "stop_at", "check_every", "num_check_rows",
              "batch_size", "lr", "warmup_steps", "seed", "num_threads")  # fmt: skip


class WarmStartRecipe(StrictModel):
    """Everything that decides a warm start from a set of rows."""

    # StrictModel's config, and the fields' docstrings as their descriptions (for --help)
    model_config = {**StrictModel.model_config, "use_attribute_docstrings": True}

    init: str = "shipped"
    """Start weights: "shipped" (the calculator model), "random" (its architecture, random
    weights), or a model directory."""
    fraction: float = pydantic.Field(default=0.25, gt=0.0, le=1.0)
    """Fraction of the (non-check) rows trained on, solved."""
    max_steps: int = pydantic.Field(default=400, ge=1)
    """Most optimizer steps."""
    stop_at: float | None = pydantic.Field(default=0.3, gt=0.0, le=1.0)
    """Stop once expected pass@1 on the check rows reaches this (None: run `max_steps`)."""
    check_every: int = pydantic.Field(default=25, ge=1)
    """Steps between two checks of expected pass@1."""
    num_check_rows: int = pydantic.Field(default=64, ge=1)
    """Rows held out of training to check on."""
    batch_size: int = pydantic.Field(default=32, ge=1)
    """Solved examples per step."""
    lr: float = pydantic.Field(default=1e-3, gt=0.0)
    """Peak learning rate (linear warmup, cosine decay to 10% over `max_steps`)."""
    warmup_steps: int = pydantic.Field(default=20, ge=0)
    """Warmup steps of the schedule."""
    seed: int = 0
    """Seed of the row split and batch order."""
    num_threads: int = pydantic.Field(default=2, ge=1)
    """torch threads (the machines are shared 2-core boxes)."""


DEFAULT_RECIPE = WarmStartRecipe()


def solved_conversation(row: dict[str, Any]) -> list[dict[str, str]]:
    """The row's prompt and the assistant turn that answers it right."""
    truth = (row.get("reward_spec") or {}).get("ground_truth")
    if not isinstance(truth, str) or not truth:
        raise ValueError(f"row {row.get('extra_info', {}).get('task_key', '?')}: "
                         "reward_spec.ground_truth must be a non-empty string")  # fmt: skip
    return [*row["prompt"], {"role": "assistant", "content": f"<answer>{truth}</answer>"}]


def split_rows(
    rows: list[dict], *, fraction: float, num_check: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """(train, check): a seeded shuffle; the first `num_check` rows are held out to check
    on, and `fraction` of the rest is trained on."""
    if len(rows) <= num_check:
        raise ValueError(f"{len(rows)} rows: need more than the {num_check} check rows")
    order = list(rows)
    random.Random(seed).shuffle(order)
    check, rest = order[:num_check], order[num_check:]
    return rest[: max(1, round(fraction * len(rest)))], check


def answer_scores(model: Any, examples: list[tuple[list[int], list[int]]], *, pad_id: int):
    """(expected pass@1, greedy accuracy) over solved examples, teacher-forced: the mean
    probability of each example's whole generated span, and the fraction whose every
    generated token is the likeliest one."""
    import torch

    from demo.sft import IGNORE_INDEX, collate

    probabilities, greedy = [], []
    with torch.no_grad():
        for start in range(0, len(examples), 32):
            input_ids, attention, labels = collate(examples[start : start + 32], pad_id=pad_id)
            logits = model(input_ids=input_ids, attention_mask=attention).logits  # [B, T, V]
            targets = labels[:, 1:]  # [B, T-1]
            on = targets != IGNORE_INDEX
            log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            picked = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            probabilities += (picked * on).sum(-1).exp().tolist()
            hits = (logits[:, :-1].argmax(-1) == targets) | ~on
            greedy += hits.all(-1).float().tolist()
    return sum(probabilities) / len(probabilities), sum(greedy) / len(greedy)


class _Stop(Exception):
    """Raised from train_sft's per-step callback to end training at a check."""


def resolve_init(init: str) -> Path:
    """The model directory a recipe's `init` names."""
    from demo.tinymodel import build_random_tiny_model, shipped_model_dir

    if init == "shipped":
        return shipped_model_dir()
    if init == "random":
        return build_random_tiny_model()
    if not (Path(init) / "config.json").is_file():
        raise ValueError(f"--init {init}: not a model directory (no config.json)")
    return Path(init)


def warm_start(
    rows: list[dict],
    out_dir: str | Path,
    recipe: WarmStartRecipe = DEFAULT_RECIPE,
    *,
    snapshot_every: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train `recipe.init` on solved rows and save the model (tokenizer files copied
    unchanged) into `out_dir`; returns what it wrote to `out_dir/tether_warmstart.json`.
    `snapshot_every`: also save the weights every this many steps under `out_dir/steps/N`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from demo.sft import train_sft

    started = time.monotonic()
    init_dir = resolve_init(recipe.init)
    out_dir = Path(out_dir)
    train_rows, check_rows = split_rows(
        rows, fraction=recipe.fraction, num_check=recipe.num_check_rows, seed=recipe.seed
    )
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    pad_id = tokenizer.pad_token_id

    examples, check = _encoded(tokenizer, train_rows), _encoded(tokenizer, check_rows)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, recipe.num_threads))
    checks: list[dict[str, float]] = []
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)

    def record(step: int) -> None:
        model.eval()
        expected, greedy = answer_scores(model, check, pad_id=pad_id)
        model.train()
        checks.append({"step": step, "expected_pass_at_1": expected, "greedy": greedy})
        log(f"step {step}: expected pass@1 {expected:.3f}, greedy {greedy:.3f}")

    def after_step(step: int, loss: float) -> None:
        done = step + 1
        if snapshot_every and done % snapshot_every == 0:
            model.save_pretrained(out_dir / "steps" / str(done))
        if done % recipe.check_every == 0 or done == recipe.max_steps:
            record(done)
            if recipe.stop_at is not None and checks[-1]["expected_pass_at_1"] >= recipe.stop_at:
                raise _Stop

    losses: list[float] = []
    try:
        with torch.random.fork_rng():
            torch.manual_seed(recipe.seed)
            record(0)
            if recipe.stop_at is None or checks[-1]["expected_pass_at_1"] < recipe.stop_at:
                train_sft(
                    model,
                    examples,
                    pad_id=pad_id,
                    num_steps=recipe.max_steps,
                    batch_size=min(recipe.batch_size, len(examples)),
                    peak_lr=recipe.lr,
                    warmup_steps=min(recipe.warmup_steps, recipe.max_steps),
                    seed=recipe.seed,
                    log=lambda step, loss: (losses.append(loss), after_step(step, loss)),
                )
    except _Stop:
        pass
    finally:
        torch.set_num_threads(threads)
    info = {
        "recipe": recipe.model_dump(),
        "init_dir": str(init_dir),
        "num_rows": len(rows),
        "num_train_rows": len(train_rows),
        "steps": checks[-1]["step"],
        "checks": checks,
        "final_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "seconds": round(time.monotonic() - started, 1),
    }
    _save(model, out_dir, init_dir, info)
    return info


def _encoded(tokenizer: Any, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    from demo.sft import encode_conversation

    return [encode_conversation(tokenizer, solved_conversation(row)) for row in rows]


def _save(model: Any, out_dir: Path, init_dir: Path, info: dict[str, Any]) -> None:
    """The model, the tokenizer files of `init_dir` byte for byte, and the build record."""
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        if (init_dir / name).is_file():
            shutil.copyfile(init_dir / name, out_dir / name)
    (out_dir / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m demo.warmstart", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", required=True, type=Path, help="SkyRL rows (JSONL)")
    parser.add_argument("--out", required=True, type=Path, help="model directory to write")
    fields = WarmStartRecipe.model_fields
    for name in CLI_FIELDS:
        field = fields[name]
        kind = {float | None: float}.get(field.annotation, field.annotation)
        said = " ".join(field.description.split()).replace("%", "%%")  # argparse's % format
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=field.default,
                            help=f"{said} (default: {field.default})")  # fmt: skip
    parser.add_argument("--no-stop", action="store_true", help="run --max-steps, no early stop")
    parser.add_argument("--snapshot-every", type=int, help="also save weights every N steps")
    args = parser.parse_args(argv)
    from demo.data import read_jsonl

    settings = {name: getattr(args, name) for name in CLI_FIELDS}
    if args.no_stop:
        settings["stop_at"] = None
    if not args.rows.is_file():
        parser.exit(2, f"python -m demo.warmstart: --rows {args.rows}: no such file\n")
    try:
        recipe = WarmStartRecipe(**settings)
        rows = read_jsonl(args.rows)
        info = warm_start(rows, args.out, recipe, snapshot_every=args.snapshot_every)
    except (ValueError, pydantic.ValidationError) as e:
        parser.exit(2, f"python -m demo.warmstart: {e}\n")
    last = info["checks"][-1]
    print(f"{args.out}: {info['steps']} steps, expected pass@1 {last['expected_pass_at_1']:.3f}"
          f", greedy {last['greedy']:.3f}, {info['seconds']} s")  # fmt: skip


if __name__ == "__main__":
    main()
