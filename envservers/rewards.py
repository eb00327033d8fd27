"""Rule rewards from a SkyRL dataset row's `reward_spec`. Pure functions.

Understood shapes (both appear in our users' datasets):

    {"method": "rule", "ground_truth": "42", "must_call_tool": true, "tool_sequence": ["add"]}
    {"method": "rule", "ground_truth": {"answer": "42",
                                        "success": {"must_call_tool": "add"},
                                        "tool_sequence": [{"step": 1, "tool": "add", ...}]}}

- exact answer: the final answer equals the ground truth — numerically when both parse as
  numbers (42 == 42.0 == " 42 "), else as stripped strings;
- `must_call_tool`: true = at least one successful tool call; a string = that tool was
  called successfully;
- `tool_sequence`: the expected tool names appear, in order, among the successful calls
  (other calls may come between them).

The episode scores 1.0 when every rule present holds and 0.0 otherwise; with no final
answer it scores 0.0. Failed calls (errors) never count as calls made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardRules:
    answer: str | None  # None = no answer to compare
    must_call_tool: bool | str
    tool_sequence: tuple[str, ...]


def _tool_name(entry: Any) -> str:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        for key in ("tool", "name"):
            if isinstance(entry.get(key), str):
                return entry[key]
    raise ValueError(f"reward_spec.tool_sequence: entry {entry!r} names no tool")


def rules_from_spec(reward_spec: dict[str, Any] | None) -> RewardRules:
    """Read the rules out of a reward_spec; ValueError for a shape we cannot score."""
    spec = reward_spec or {}
    truth = spec.get("ground_truth")
    must: Any = spec.get("must_call_tool", False)
    sequence: Any = spec.get("tool_sequence", [])
    if isinstance(truth, dict):
        success = truth.get("success") or {}
        must = truth.get("must_call_tool", success.get("must_call_tool", must))
        sequence = truth.get("tool_sequence", sequence)
        truth = truth.get("answer", truth.get("ground_truth"))
    if truth is not None and not isinstance(truth, str | int | float):
        raise ValueError(f"reward_spec.ground_truth: cannot compare an answer to {truth!r}")
    if not isinstance(must, bool | str):
        raise ValueError("reward_spec.must_call_tool: must be a boolean or a tool name")
    if not isinstance(sequence, list):
        raise ValueError("reward_spec.tool_sequence: must be a list")
    return RewardRules(
        answer=None if truth is None else str(truth),
        must_call_tool=must,
        tool_sequence=tuple(_tool_name(e) for e in sequence),
    )


def _as_number(text: str) -> float | None:
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answers_match(answer: str, truth: str) -> bool:
    a, t = _as_number(answer), _as_number(truth)
    if a is not None and t is not None:
        return math.isclose(a, t, rel_tol=1e-9, abs_tol=1e-9)
    return answer.strip() == truth.strip()


def is_subsequence(expected: tuple[str, ...], calls: list[str]) -> bool:
    remaining = iter(calls)
    return all(any(name == call for call in remaining) for name in expected)


def tool_rules_hold(rules: RewardRules, successful_calls: list[str]) -> bool:
    if rules.must_call_tool is True and not successful_calls:
        return False
    if isinstance(rules.must_call_tool, str) and rules.must_call_tool not in successful_calls:
        return False
    return is_subsequence(rules.tool_sequence, successful_calls)


def score(answer: str | None, rules: RewardRules, successful_calls: list[str]) -> float:
    """1.0 if the final answer and the tool calls satisfy every rule, else 0.0."""
    if answer is None:
        return 0.0
    if rules.answer is not None and not answers_match(answer, rules.answer):
        return 0.0
    return 1.0 if tool_rules_hold(rules, successful_calls) else 0.0
