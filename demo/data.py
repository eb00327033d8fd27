"""The calculator demo task: SkyRL dataset rows, the tool specs, and supervised demonstrations.

A row asks "What is A + B?" for 2-3 digit A and B (guessing is hopeless; calling the `add`
tool is not). Train and eval rows never share a question: a row's split is decided by the
MD5 of its task key, as in SkyRL's hash-based splits. The eval set is fixed (its own seed).

Demonstrations for the supervised warm start come in two kinds, mixed half and half: the
assistant calls `add` and answers from the result, or it skips the tool and guesses a wrong
number. A model trained on them starts RL "somewhere between never and always right"; what
RL has to learn is the decision to call the tool.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from demo import SHIPPED_MODEL_DIR

SYSTEM_PROMPT = (
    "You are a calculator assistant. To call a tool, write <tool_call> JSON </tool_call> "
    "and wait for the result. Give the final answer as <answer>NUMBER</answer>."
)

# The tools a demo row offers (its `extra_info.tools`): only `add`, so the prompt stays short
# (~140 tokens; all four calculator tools would make it ~400, which every learner step pays).
DEMO_TOOL_NAMES = ["add"]
# Their OpenAI-style specs as the env server hands them out at reset(), recorded when the
# shipped model was built (demo/env_tools.py fetches them over gRPC; a test checks that the
# env server still hands out exactly this text).
DEMO_TOOLS: list[dict[str, Any]] = json.loads((SHIPPED_MODEL_DIR / "tools.json").read_text())

NUMBER_LOW, NUMBER_HIGH = 10, 999  # operands are 2-3 digit numbers
EVAL_FRACTION = 0.1
DEFAULT_EVAL_SEED = 1234


def task_key(a: int, b: int) -> str:
    return f"calculator-add-{a}-{b}"


def split_of(key: str, eval_fraction: float = EVAL_FRACTION) -> str:
    """The split of a task key: "eval" for a stable `eval_fraction` of keys (by MD5)."""
    bucket = int(hashlib.md5(key.encode()).hexdigest()[:8], 16) / 0x1_0000_0000
    return "eval" if bucket < eval_fraction else "train"


def make_row(a: int, b: int, *, split: str, must_call_tool: bool = False) -> dict[str, Any]:
    """One SkyRL row asking for a + b."""
    reward_spec: dict[str, Any] = {"method": "rule", "ground_truth": str(a + b)}
    if must_call_tool:
        reward_spec["must_call_tool"] = True
    return {
        "data_source": "calculator",
        "env_class": "calculator",
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ],
        "reward_spec": reward_spec,
        "extra_info": {
            "task_key": task_key(a, b),
            "split": split,
            "a": a,
            "b": b,
            "tools": list(DEMO_TOOL_NAMES),
        },
    }


def sample_operands(
    num: int, *, seed: int, split: str, eval_fraction: float = EVAL_FRACTION
) -> list[tuple[int, int]]:
    """`num` distinct (a, b) pairs of the given split, drawn with a seeded RNG."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    rng = random.Random(f"{split}:{seed}")
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < num:
        pair = (rng.randint(NUMBER_LOW, NUMBER_HIGH), rng.randint(NUMBER_LOW, NUMBER_HIGH))
        if pair not in seen and split_of(task_key(*pair), eval_fraction) == split:
            seen.add(pair)
            pairs.append(pair)
    return pairs


def make_rows(
    num: int, *, seed: int, split: str = "train", must_call_tool: bool = False
) -> list[dict[str, Any]]:
    """`num` calculator rows of one split; the same seed gives the same rows."""
    return [
        make_row(a, b, split=split, must_call_tool=must_call_tool)
        for a, b in sample_operands(num, seed=seed, split=split)
    ]


def eval_rows(num: int = 200, *, seed: int = DEFAULT_EVAL_SEED) -> list[dict[str, Any]]:
    """The fixed eval set (held-out questions)."""
    return make_rows(num, seed=seed, split="eval")


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_dataset(
    out_dir: str | Path, *, num_train: int = 10_000, num_eval: int = 200, seed: int = 0
) -> tuple[Path, Path]:
    """Write `train.jsonl` (seeded) and `eval.jsonl` (the fixed eval set) into `out_dir`."""
    out_dir = Path(out_dir)
    train = write_jsonl(out_dir / "train.jsonl", make_rows(num_train, seed=seed, split="train"))
    evals = write_jsonl(out_dir / "eval.jsonl", eval_rows(num_eval))
    return train, evals


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes tool call as the assistant writes it."""
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{payload}\n</tool_call>"


def demonstration(a: int, b: int, *, use_tool: bool, rng: random.Random) -> list[dict[str, Any]]:
    """A full conversation for a + b: call `add` and copy its result, or guess wrongly."""
    messages = make_row(a, b, split="train")["prompt"]
    if use_tool:
        return messages + [
            {"role": "assistant", "content": tool_call_text("add", {"a": a, "b": b})},
            {"role": "tool", "content": str(a + b)},
            {"role": "assistant", "content": f"<answer>{a + b}</answer>"},
        ]
    guess = a + b
    while guess == a + b:
        guess = rng.randint(2 * NUMBER_LOW, 2 * NUMBER_HIGH)
    return messages + [{"role": "assistant", "content": f"<answer>{guess}</answer>"}]


def demonstrations(
    num: int, *, seed: int, tool_fraction: float = 0.5
) -> list[list[dict[str, Any]]]:
    """`num` demonstrations over train-split questions; `tool_fraction` of them use the tool."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    rng = random.Random(f"demos:{seed}")
    return [
        demonstration(a, b, use_tool=rng.random() < tool_fraction, rng=rng)
        for a, b in sample_operands(num, seed=seed, split="train")
    ]
