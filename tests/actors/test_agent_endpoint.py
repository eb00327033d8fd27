"""actors/agent_endpoint.py served from the session's real vLLM engine, called with the
`openai` package as an agent would: the answers are the engine's tokens, a continued
conversation stays one segment, and the endpoint is no open model server."""

from __future__ import annotations

import asyncio

import openai
import pytest
import torch
from transformers import AutoTokenizer

from actors.agent_endpoint import AgentEndpoint
from actors.chat import ChatTemplate
from actors.config import RolloutConfig, SamplingConfig
from tests.actors.actor_play import generated_runs

pytestmark = pytest.mark.vllm

PROMPT = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 40 + 2?"},
]
LIMITS = RolloutConfig(max_input_length=512, max_generate_length=16, max_sequence_length=640)


@pytest.fixture
async def endpoint(vllm_engine, tiny_model_dir):
    await vllm_engine.load_snapshot(str(tiny_model_dir), 0)
    chat = ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir))
    served = AgentEndpoint(vllm_engine, chat, LIMITS, model_name="tiny")
    await served.start()
    yield served
    await served.stop()


def _client(endpoint: AgentEndpoint, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=endpoint.base_url(), api_key=key, max_retries=0)


async def test_an_agents_calls_are_the_engines_tokens_in_one_segment(endpoint):
    key, calls = endpoint.open_episode(SamplingConfig(temperature=1.0), seed=None)
    client = _client(endpoint, key)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    first = await client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=8)
    answer = first.choices[0].message
    history = [*PROMPT, answer.model_dump(), {"role": "user", "content": "Are you sure?"}]
    second = await client.chat.completions.create(model="tiny", messages=history)
    (segment,) = calls.segments
    result = segment.result
    generated = [t for t, m in zip(result.token_ids, result.loss_mask, strict=True) if m]
    assert first.usage.completion_tokens + second.usage.completion_tokens == len(generated)
    chat = endpoint.chat
    first_ids = generated[: first.usage.completion_tokens]
    assert answer.content == chat.assistant_text(first_ids)
    # The second call's prompt: the first call's tokens, its answer, the templated delta.
    closing_eos = result.turn_finish_reasons[-1] == "length"  # a cut turn is closed with one
    after_second = second.usage.prompt_tokens + second.usage.completion_tokens + closing_eos
    assert after_second == len(result.token_ids)
    assert result.num_turns == 2 and calls.num_calls == 2
    assert all(v == 0 for v, m in zip(result.versions, result.loss_mask, strict=True) if m)
    assert all(lp <= 0 for lp, m in zip(result.logprobs, result.loss_mask, strict=True) if m)
    endpoint.close_episode(key)
    with pytest.raises(openai.AuthenticationError):  # an ended episode's key
        await client.chat.completions.create(model="tiny", messages=PROMPT)


async def test_keys_that_name_no_episode_and_calls_it_cannot_serve_are_refused(endpoint):
    with pytest.raises(openai.AuthenticationError):
        await _client(endpoint, "sk-anything").models.list()
    key, calls = endpoint.open_episode(SamplingConfig())
    client = _client(endpoint, key)
    with pytest.raises(openai.BadRequestError, match="streaming is not served"):
        await client.chat.completions.create(model="tiny", messages=PROMPT, stream=True)
    long_ask = [{"role": "user", "content": "add " * 600}]
    with pytest.raises(openai.BadRequestError, match="context too long"):
        await client.chat.completions.create(model="tiny", messages=long_ask)
    with pytest.raises(openai.BadRequestError, match="n: one choice per call"):
        await client.chat.completions.create(model="tiny", messages=PROMPT, n=2)
    assert calls.segments == []  # nothing refused was recorded
    endpoint.close_episode(key)


class _Recording:
    """The endpoint's engine, keeping what each call generated, by its prompt."""

    def __init__(self, engine) -> None:
        self.engine, self.version = engine, engine.version
        self.generated: dict[tuple[int, ...], list[int]] = {}

    async def generate(self, prompt_token_ids, turn):
        generation = await self.engine.generate(prompt_token_ids, turn)
        self.generated[tuple(prompt_token_ids)] = list(generation.token_ids)
        return generation


async def test_two_hundred_agent_episodes_hold_the_engines_tokens_and_logprobs(
    endpoint, hf_tiny_model
):
    """200 two-call episodes at once: each call's prompt is the conversation's tokens so far,
    what it generated is the engine's ids, the delta between the calls is the chat
    template's rendering of the new user message; logprobs recomputed by transformers
    agree."""
    recording = _Recording(endpoint.engine)
    endpoint.engine = recording
    follow_up = {"role": "user", "content": "Are you sure?"}
    chat = endpoint.chat

    async def episode(i: int):
        key, calls = endpoint.open_episode(SamplingConfig(temperature=1.0), seed=i)
        client = _client(endpoint, key)
        messages = [PROMPT[0], {"role": "user", "content": f"What is {i} + {2 * i}?"}]
        for _ in range(2):
            reply = await client.chat.completions.create(model="tiny", messages=messages,
                                                         max_tokens=8)  # fmt: skip
            messages += [reply.choices[0].message.model_dump(exclude_none=True), follow_up]
        endpoint.close_episode(key)
        return calls

    try:
        episodes = await asyncio.gather(*(episode(i) for i in range(200)))
    finally:
        endpoint.engine = recording.engine
    delta = chat.observation_ids([follow_up])
    worst = 0.0
    for calls in episodes:
        (segment,) = calls.segments
        result = segment.result
        runs = generated_runs(result.loss_mask)
        assert len(runs) == result.num_turns == 2
        for k, (start, end) in enumerate(runs):
            prompt = tuple(result.token_ids[:start])
            assert recording.generated[prompt] == result.token_ids[start:end]
            if k == 0:  # then (a closing EOS for a cut turn) the templated follow-up
                closed = end + (result.turn_finish_reasons[k] == "length")
                assert result.token_ids[closed : runs[k + 1][0]] == delta
        ids = torch.tensor([result.token_ids])
        with torch.no_grad():
            logits = hf_tiny_model(ids).logits[0, :-1]
        reference = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(result.loss_mask[1:], dtype=torch.bool)
        got = torch.tensor(result.logprobs[1:])
        worst = max(worst, float((got - reference)[mask].abs().max()))
    print(f"\n200 agent episodes: logprob |endpoint - transformers| max {worst:.2e}")
    assert worst < 1e-4
