"""The chat-completions calls of one agent episode, kept as token sequences: token in, token
out, whatever the agent does with the text.

An agent sends the whole conversation on every call. The first call's messages are templated
once: the prompt of a segment. A later call whose messages extend a segment's conversation
(the same messages, the assistant turns as they were returned, then only new non-assistant
messages: tool results, a user turn) continues that segment: its prompt is the segment's
tokens plus the chat template's delta for the new messages, so the tokens the engine
generated are never re-tokenised and the logprobs belong to the tokens trained on. A call
that extends no segment (the agent rewrote its history, a second agent in the same episode)
starts a new one, counted, never merged into another.

    calls = AgentCalls(chat, max_input_length=...)
    plan = calls.plan(messages, tools)            # which segment, the prompt's token ids
    generation = await engine.generate(plan.prompt_ids, turn)
    message = calls.record(plan, generation, tool_calls)  # the assistant message to return
    calls.segments                                 # one EpisodeResult per segment

Calls of one episode are planned and recorded one at a time (the endpoint holds a lock per
episode), so two calls never extend the same segment at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from actors.chat import ChatTemplate
from actors.types import EpisodeResult, Generation


class CallRefused(ValueError):
    """A call this episode cannot serve (its messages are malformed, or its context is
    longer than the rollout allows); the message is for the agent."""


@dataclass
class Segment:
    """One conversation of the episode, as the model saw it."""

    messages: list[dict[str, Any]]
    """Its conversation so far, normalised (what the next call must start with)."""
    tools: list[dict[str, Any]] | None
    result: EpisodeResult = field(default_factory=EpisodeResult)
    """Its tokens, logprobs, loss mask (1 on generated tokens), versions."""


@dataclass(frozen=True)
class CallPlan:
    index: int
    """The segment this call continues; len(segments) when it starts a new one."""
    prompt_ids: list[int]
    """What to generate from: the segment's tokens and the templated delta, or a new prompt."""
    new_ids: list[int]
    """The part of prompt_ids the segment does not hold yet (all of it for a new segment)."""
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


class AgentCalls:
    def __init__(self, chat: ChatTemplate, *, max_input_length: int) -> None:
        self.chat = chat
        self.max_input_length = max_input_length
        self.segments: list[Segment] = []
        self.num_calls = 0
        self.last_finish_reason = ""
        """How the newest call's turn ended (`stop` or `length`)."""
        self.generate_s = 0.0
        """Seconds its calls spent generating in the engine; the rest of the agent's run is
        its own (its tools, its code, HTTP), as an env step is for a stepped episode."""

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> CallPlan:
        """How to serve a call with these messages (and tools); CallRefused when it cannot."""
        normal = [normalise(m, k) for k, m in enumerate(messages)]
        if not normal:
            raise CallRefused("messages: at least one message is needed")
        tools = tools or None
        for index in range(len(self.segments) - 1, -1, -1):  # the newest first
            segment = self.segments[index]
            delta = extension(segment, normal, tools)
            if delta is not None:
                new_ids = self._delta_ids(segment, delta)
                return self._checked(
                    CallPlan(index, segment.result.token_ids + new_ids, new_ids, normal, tools)
                )
        try:
            prompt = self.chat.prompt_ids([template_form(m) for m in normal], tools)
        except ValueError as e:
            raise CallRefused(f"messages: the chat template cannot render them: {e}") from e
        return self._checked(CallPlan(len(self.segments), prompt, prompt, normal, tools))

    def record(
        self,
        plan: CallPlan,
        generation: Generation,
        tool_calls: list[dict[str, Any]],
        text: str | None = None,
    ) -> dict[str, Any]:
        """Add the planned prompt part and the generated turn to the segment; returns the
        assistant message the agent gets (`tool_calls` in OpenAI form, parsed by the caller
        from the text with the model family's format). `text`: the turn's assistant text,
        when the caller has decoded it already."""
        if plan.index == len(self.segments):
            segment = Segment(messages=[], tools=plan.tools)
            segment.result.prompt_len = len(plan.new_ids)
            self.segments.append(segment)
        segment = self.segments[plan.index]
        assert segment.result.token_ids == plan.prompt_ids[: len(segment.result.token_ids)], (
            "a segment changed between plan and record: calls of one episode must be serialised"
        )
        result = segment.result
        result.append(plan.new_ids)
        result.append(generation.token_ids, logprobs=generation.logprobs,
                      versions=generation.versions)  # fmt: skip
        result.num_turns += 1
        result.turn_finish_reasons.append(generation.finish_reason)
        ended = bool(generation.token_ids) and generation.token_ids[-1] == self.chat.eos_token_id
        if not ended:
            result.append([self.chat.eos_token_id])  # close the cut turn as the template does
        if text is None:
            text = self.chat.assistant_text(generation.token_ids)
        message = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = tool_calls
        segment.messages = [*plan.messages, normalise(message, len(plan.messages))]
        self.num_calls += 1
        self.last_finish_reason = generation.finish_reason
        return message

    def _delta_ids(self, segment: Segment, delta: list[dict[str, Any]]) -> list[int]:
        try:
            return self.chat.observation_ids([template_form(m) for m in delta])
        except ValueError as e:
            raise CallRefused(f"messages: the chat template cannot render the new ones: {e}") from e

    def _checked(self, plan: CallPlan) -> CallPlan:
        if len(plan.prompt_ids) > self.max_input_length:
            raise CallRefused(
                f"context too long: {len(plan.prompt_ids)} tokens, this rollout allows "
                f"{self.max_input_length} (max_input_length)"
            )
        return plan


def extension(
    segment: Segment, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The messages a call adds to `segment`'s conversation, or None when it does not extend
    it: other tools, a changed history, nothing new, or a new assistant message (a turn the
    model did not generate cannot be trained as if it had)."""
    known = segment.messages
    if tools != segment.tools or len(messages) <= len(known) or messages[: len(known)] != known:
        return None
    delta = messages[len(known) :]
    if any(m["role"] == "assistant" for m in delta):
        return None
    return delta


def normalise(message: Any, index: int) -> dict[str, Any]:
    """A message in one comparable form: role, content as text (None and text parts
    joined), tool calls as (name, arguments JSON with sorted keys), tool_call_id and name
    when present. CallRefused when it is not a chat message."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise CallRefused(f"messages[{index}]: expected an object with a string 'role'")
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: only text parts carry anything here
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
            raise CallRefused(f"messages[{index}].content: only text parts are supported")
        content = "".join(parts)
    if content is not None and not isinstance(content, str):
        raise CallRefused(f"messages[{index}].content: expected a string, a list or null")
    normal: dict[str, Any] = {"role": message["role"], "content": content or ""}
    calls = message.get("tool_calls") or []
    if calls:
        normal["tool_calls"] = [_normal_call(call, index) for call in calls]
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            normal[key] = message[key]
    return normal


def _normal_call(call: Any, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise CallRefused(f"messages[{index}].tool_calls: each needs function.name")
    arguments = function.get("arguments", "{}")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = arguments  # compared as the text it is
    return {"name": function["name"], "arguments": json.dumps(parsed, sort_keys=True)}


def template_form(message: dict[str, Any]) -> dict[str, Any]:
    """A normalised message as a chat template takes it (tool calls with their arguments as
    objects, as Hugging Face templates expect)."""
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if "tool_calls" in message:
        out["tool_calls"] = [
            {"type": "function",
             "function": {"name": c["name"], "arguments": json.loads(c["arguments"])}}
            for c in message["tool_calls"]
        ]  # fmt: skip
    return out
