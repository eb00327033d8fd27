"""A `verifiers` environment module as its authors write them (verifiers 0.1's
`load_environment`), on the demo's calculator questions so that the tiny model plays it:

    load_environment(kind="single" | "multi" | "tool", num_examples=64, transcripts=None)

    single   SingleTurnEnv: one answer, scored by the answer and its format
    multi    a MultiTurnEnv of its own: a wrong answer is told to try again (3 turns)
    tool     ToolEnv with an `add` tool (the demo model's tool, as a Python function)

Each rubric has a weighted correctness function and other named functions. `transcripts`
(a JSONL path) adds a weight-0 function that records each scored rollout (prompt,
completion, answer), so a test can score the same completion with verifiers itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import verifiers as vf
from datasets import Dataset

from demo.data import SYSTEM_PROMPT, sample_operands

PARSER = vf.XMLParser(["answer"], answer_field="answer")


def add(a: float, b: float) -> float:
    """Add two numbers: a + b.

    Args:
        a: first operand
        b: second operand
    """
    return a + b


def correct_answer(completion, answer, **kwargs) -> float:
    given = PARSER.parse_answer(completion)
    try:
        return float(given is not None and float(given) == float(answer))
    except ValueError:
        return 0.0


def fewer_turns(completion, **kwargs) -> float:
    replies = [m for m in completion if m["role"] == "assistant"]
    return 1.0 / max(1, len(replies))


def used_a_tool(completion, **kwargs) -> float:
    return float(any(m["role"] == "tool" for m in completion))


class RetryEnv(vf.MultiTurnEnv):
    """Answer; a wrong answer is told so and may try again."""

    async def is_completed(self, messages, state, **kwargs) -> bool:
        last = messages[-1]
        return last["role"] == "assistant" and correct_answer([last], state["answer"]) == 1.0

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "That is not right. Try again."}], state


def load_environment(
    kind: str = "single", num_examples: int = 64, transcripts: str | None = None
) -> vf.Environment:
    operands = sample_operands(num_examples, seed=7, split="train")
    dataset = Dataset.from_list(
        [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in operands]
    )
    funcs: list[Any] = [correct_answer, PARSER.get_format_reward_func()]
    weights = [1.0, 0.2]
    if kind == "multi":
        funcs, weights = [correct_answer, fewer_turns], [1.0, 0.1]
    if kind == "tool":
        funcs, weights = [correct_answer, used_a_tool], [1.0, 0.0]
    if transcripts:
        funcs, weights = [*funcs, _recorder(Path(transcripts))], [*weights, 0.0]
    common = {"dataset": dataset, "system_prompt": SYSTEM_PROMPT, "parser": PARSER,
              "rubric": vf.Rubric(funcs=funcs, weights=weights, parser=PARSER)}  # fmt: skip
    if kind == "single":
        return vf.SingleTurnEnv(**common)
    if kind == "multi":
        return RetryEnv(max_turns=3, **common)
    if kind == "tool":
        return vf.ToolEnv(tools=[add], max_turns=4, **common)
    raise ValueError(f"kind must be single, multi or tool, not {kind!r}")


def _recorder(path: Path):
    def transcript(prompt, completion, answer, **kwargs) -> float:
        record = {"prompt": prompt, "completion": completion, "answer": answer}
        with path.open("a") as f:
            f.write(json.dumps(record, default=_plain) + "\n")
        return 0.0

    return transcript


def _plain(value: Any) -> Any:
    """A tool call the rollout keeps as the client's object, as JSON data."""
    return value.model_dump()
