"""The episode logic shared by our tool-using environments (calculator, sql, python, mcp,
noop): the message-space counterpart of skyrl-gym's `BaseTextEnv` with tool groups.

One step reads one assistant message (its tool calls in the model family's format,
`envserver.tool_format`: common/tool_formats.py):

    tool calls present          -> run each, one {"role": "tool"} message per call, reward 0
    else <answer>X</answer>     -> done; reward = score(X) under the row's reward_spec
    else                        -> done, reward 0 (the model neither acted nor answered)

Tool calls win over an answer in the same message: the model has to answer again after
seeing the results.
Every failure of a call — malformed block, unknown tool, bad arguments, an exception in the
tool — is a `tool` message starting with "error: " and counts in `tool_errors`.
Reaching `max_turns` (from the row's extra_info, else the environment's default) ends the
episode with reward 0.
"""

from __future__ import annotations

from typing import Any

from common.tool_formats import parser_for
from common.tool_parsing import ToolCallError, extract_tag
from envservers import rewards
from envservers.tools import ToolGroup
from envservers.types import Environment, validate_task
from protos.types import Observation, StepResult


class ToolEnv(Environment):
    """Subclasses provide the tool group (`make_tools`) and may override `score_answer`."""

    answer_tag = "answer"

    def __init__(
        self, *, max_tool_calls_per_step: int = 8, max_turns: int = 32, tool_format: str = "hermes"
    ):
        self.max_tool_calls_per_step = max_tool_calls_per_step
        self.parse_tool_calls = parser_for(tool_format)  # the model family's way of calling
        self.max_turns = max_turns
        self.tools: ToolGroup | None = None
        self.task: dict[str, Any] = {}
        self.rules = rewards.RewardRules(answer=None, must_call_tool=False, tool_sequence=())
        self.turns = 0
        self.num_tool_calls = 0
        self.tool_errors = 0
        self.successful_calls: list[str] = []

    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        raise NotImplementedError

    def reward_rules(self, reward_spec: dict[str, Any] | None) -> rewards.RewardRules:
        return rewards.rules_from_spec(reward_spec)

    async def score_answer(self, answer: str) -> float:
        return rewards.score(answer, self.rules, self.successful_calls)

    async def reset(self, task: dict[str, Any]) -> Observation:
        self.task = validate_task(task)
        self.rules = self.reward_rules(task.get("reward_spec"))
        extra = task.get("extra_info") or {}
        if "max_turns" in extra:
            if not isinstance(extra["max_turns"], int) or extra["max_turns"] < 1:
                raise ValueError("task.extra_info.max_turns: must be a positive integer")
            self.max_turns = extra["max_turns"]
        self.tools = await self.make_tools(task)
        return Observation(
            messages=list(task.get("prompt", [])),
            tools=self.tools.specs(),
            metadata=self.metadata(),
        )

    def metadata(self, **extra: Any) -> dict[str, Any]:
        return {
            "num_tool_calls": self.num_tool_calls,
            "tool_errors": self.tool_errors,
            "turns": self.turns,
            **extra,
        }

    async def step(self, action_text: str) -> StepResult:
        assert self.tools is not None, "step before reset"
        self.turns += 1
        calls = self.parse_tool_calls(action_text)
        if not calls:
            answer = extract_tag(action_text, self.answer_tag)
            if answer is None:
                return StepResult([], 0.0, True, self.metadata(stop_reason="no_action"))
            reward = await self.score_answer(answer)
            return StepResult([], reward, True, self.metadata(stop_reason="answer"))
        observations = []
        for index, call in enumerate(calls):
            self.num_tool_calls += 1
            if index >= self.max_tool_calls_per_step:
                text = f"error: at most {self.max_tool_calls_per_step} tool calls per turn"
                ok = False
            elif isinstance(call, ToolCallError):
                text, ok = f"error: {call.message}", False
            else:
                text, ok = await self.tools.call(call)
                if ok:
                    self.successful_calls.append(call.name)
            self.tool_errors += not ok
            observations.append({"role": "tool", "content": text})
        done = self.turns >= self.max_turns
        stop = {"stop_reason": "max_turns"} if done else {}
        return StepResult(observations, 0.0, done, self.metadata(**stop))
