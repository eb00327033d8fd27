"""The rollout on the real vLLM engine (tiny random model, the session engine of
tests/actors/conftest.py): a multi-turn episode whose token layout is exactly prompt, then
vLLM's own tokens (mask 1, the engine's version), then templated observations (mask 0) —
with turns that end on EOS or are cut at max_generate_length."""

from __future__ import annotations

import numpy as np
import pytest

from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout
from actors.group import run_group
from broker.wire import PromptTask
from demo.chat_template import observation_delta
from protos.types import Observation, StepResult

pytestmark = pytest.mark.vllm

OBSERVATION = [{"role": "tool", "content": "ok"}]


class _NeverDoneEnv:
    """Answers every turn with the same tool observation and never ends the episode."""

    async def open(self, env_class: str, task: dict):
        return self

    @property
    def observation(self):
        return Observation(messages=[{"role": "user", "content": "What is 17 + 25?"}])

    async def step(self, action_text: str):
        return StepResult(observations=OBSERVATION, metadata={"num_tool_calls": 0})

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def test_multi_turn_layout_on_vllm(vllm_engine, tokenizer):
    chat = ChatTemplate(tokenizer)
    eos = tokenizer.eos_token_id
    task = PromptTask(
        task_id="v",
        step=0,
        group_size=2,
        env_class="never",
        data_source="never",
        prompt=[{"role": "user", "content": "What is 17 + 25?"}],
        reward_spec={"ground_truth": "42"},
    )
    results = await run_group(
        Rollout(
            engine=vllm_engine,
            env=_NeverDoneEnv(),
            chat=chat,
            limits=RolloutConfig(
                max_turns=3, max_input_length=512, max_generate_length=12, max_sequence_length=1024
            ),
            sampling=SamplingConfig(temperature=1.0, seed=7),
            env_config=EnvConfig(),
        ),
        task,
    )
    delta = chat.observation_ids(OBSERVATION)
    for result in results:
        assert (result.stop_reason, result.num_turns) == ("max_turns", 3)
        ids = np.array(result.token_ids)
        mask = np.array(result.loss_mask)
        versions = np.array(result.versions)
        assert set(versions[mask == 1].tolist()) == {vllm_engine.version}
        assert set(versions[mask == 0].tolist()) == {-1}
        assert (np.array(result.logprobs)[mask == 1] <= 0).all()
        # Walk the sequence: prompt, then per turn vLLM's tokens [+ closing EOS] + delta.
        position = result.prompt_len
        for turn, finish in enumerate(result.turn_finish_reasons):
            start = position
            while position < len(ids) and mask[position] == 1:
                position += 1
            generated = ids[start:position].tolist()
            assert 1 <= len(generated) <= 12
            assert (generated[-1] == eos) == (finish == "stop")
            if turn == 2:
                assert position == len(ids)  # no observation after the last turn
                break
            if finish == "length":
                assert ids[position] == eos  # closed by a non-policy EOS
                position += 1
            assert ids[position : position + len(delta)].tolist() == delta
            assert tokenizer.decode(delta) == observation_delta(OBSERVATION)
            position += len(delta)
