"""The rollout logic on a scripted engine and an in-process calculator env: token layout,
loss masks, versions, limits, stop reasons, env outages, groups, and the wire form."""

from __future__ import annotations

import logging
import math

import msgspec
import numpy as np
import pytest

from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout, run_episode, validate_task
from actors.group import failed_samples_line, run_group
from actors.trajectory import to_trajectory
from actors.types import EpisodeResult
from broker.codec import decode, encode, token_arrays
from broker.wire import PromptTask, Trajectory
from demo.chat_template import observation_delta, render_chat
from demo.data import SYSTEM_PROMPT
from demo.tokenizer import build_tokenizer
from envservers.envs.calculator import CALCULATOR_TOOLS, CalculatorEnv, CalculatorProvider
from protos.client import TaskRejected
from tests.fakes import InProcessEnv, ScriptedEngine, by_turn, fake_logprob

ADD_TOOL = CALCULATOR_TOOLS.subset(["add"]).specs()  # what the env offers a row asking for add
BAD_CALL_ERROR = "error: unknown tool 'pow'; available: ['add']"

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "pow", "arguments": {"a": 1}}\n</tool_call>'
ANSWER = "<answer>42</answer>"
NO_RETRY_DELAY = EnvConfig(attempts=3, backoff_s=0.0)
LIMITS = RolloutConfig(
    max_turns=4, max_input_length=1024, max_generate_length=64, max_sequence_length=2048
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatTemplate(tokenizer)


def _task(*, task_id="t1", group_size=1, question="What is 17 + 25?", env_class="calculator"):
    return PromptTask(
        task_id=task_id,
        step=3,
        group_size=group_size,
        env_class=env_class,
        data_source="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        reward_spec={"method": "rule", "ground_truth": "42"},
        extra_info={"task_key": "k", "tools": ["add"]},
    )


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


async def _play(tokenizer, chat, script, *, limits=LIMITS, env=None, task=None, **engine_kw):
    engine = ScriptedEngine(tokenizer, script, **engine_kw)
    env = env or InProcessEnv()
    result = await run_episode(
        Rollout(
            engine=engine,
            env=env,
            chat=chat,
            limits=limits,
            sampling=SamplingConfig(temperature=1.0),
            env_config=NO_RETRY_DELAY,
        ),
        task or _task(),
    )
    return result, engine, env


def _segments(mask):
    """[(value, length), ...] runs of the loss mask."""
    runs = []
    for m in mask:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    return [tuple(r) for r in runs]


async def test_tool_call_then_answer_has_the_hand_computed_layout(tokenizer, chat):
    result, engine, env = await _play(tokenizer, chat, by_turn(TOOL_CALL, ANSWER), version=7)
    eos = tokenizer.eos_token_id
    prompt = chat.prompt_ids(_task().prompt, ADD_TOOL)
    turn0 = _encode(tokenizer, TOOL_CALL) + [eos]
    delta = _encode(tokenizer, observation_delta([{"role": "tool", "content": "42"}]))
    turn1 = _encode(tokenizer, ANSWER) + [eos]

    assert result.token_ids == prompt + turn0 + delta + turn1
    assert result.prompt_len == len(prompt)
    assert _segments(result.loss_mask) == [
        (0, len(prompt)),
        (1, len(turn0)),
        (0, len(delta)),
        (1, len(turn1)),
    ]
    policy = [-1] * len(prompt) + [7] * len(turn0) + [-1] * len(delta) + [7] * len(turn1)
    assert result.versions == policy
    expected_logprobs = (
        [0.0] * len(prompt)
        + [fake_logprob(i) for i in range(len(turn0))]
        + [0.0] * len(delta)
        + [fake_logprob(i) for i in range(len(turn1))]
    )
    assert result.logprobs == expected_logprobs
    assert (result.reward, result.stop_reason, result.num_turns) == (1.0, "stop", 2)
    assert result.num_tool_calls == 1
    assert result.env_metrics == {"num_tool_calls": 1.0, "tool_errors": 0.0, "turns": 2.0}
    assert result.num_generated_tokens == len(turn0) + len(turn1)
    assert result.turn_finish_reasons == ["stop", "stop"]
    assert len(result.env_step_latencies_s) == 2
    # The engine saw exactly the sequence so far at each turn (no re-tokenisation).
    assert [call.prompt_token_ids for call in engine.calls] == [prompt, prompt + turn0 + delta]
    assert env.num_closed == 1


async def test_tokens_decode_to_the_template_rendering_of_the_conversation(tokenizer, chat):
    script = by_turn(TOOL_CALL, BAD_CALL, ANSWER)
    result, _, _ = await _play(tokenizer, chat, script)
    ids, mask = np.array(result.token_ids), np.array(result.loss_mask)
    conversation = _task().prompt + [
        {"role": "assistant", "content": TOOL_CALL},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": BAD_CALL},
        {"role": "tool", "content": BAD_CALL_ERROR},
        {"role": "assistant", "content": ANSWER},
    ]
    assert tokenizer.decode(result.token_ids) + "\n" == render_chat(conversation, tools=ADD_TOOL)
    # Masked-in tokens decode to exactly the assistant turns (each closed by its EOS).
    policy_text = tokenizer.decode(ids[mask == 1].tolist())
    assert policy_text == "<|im_end|>".join([TOOL_CALL, BAD_CALL, ANSWER]) + "<|im_end|>"
    assert result.env_metrics["tool_errors"] == 1.0
    assert result.num_tool_calls == 2


async def test_versions_follow_the_engine_token_by_token(tokenizer, chat):
    # The weights change after the engine's 10th token: mid-way through the first turn.
    result, engine, _ = await _play(
        tokenizer, chat, by_turn(TOOL_CALL, ANSWER), version_of_token=lambda k: 4 + (k >= 10)
    )
    generated = [v for v in result.versions if v != -1]
    assert generated == [4] * 10 + [5] * (engine.num_generated - 10)
    assert all(v == -1 for v, m in zip(result.versions, result.loss_mask, strict=True) if not m)


async def test_final_turn_cut_by_max_generate_length_is_filtered(tokenizer, chat):
    limits = RolloutConfig(max_generate_length=3, max_input_length=1024, max_sequence_length=2048)
    result, engine, _ = await _play(tokenizer, chat, by_turn(ANSWER + " because"), limits=limits)
    # Three tokens ("<answer>", "4", "2") hold no closed answer: the env ends the
    # episode with reward 0; the turn had no EOS, so the stop reason is `length`.
    assert engine.calls[0].turn.max_tokens == 3
    assert result.turn_finish_reasons == ["length"]
    assert (result.stop_reason, result.num_turns, result.reward) == ("length", 1, 0.0)
    assert len(result.token_ids) == result.prompt_len + 3
    assert sum(result.loss_mask) == 0  # DAPO overlong filtering


async def test_without_overlong_filtering_a_cut_turn_keeps_its_mask(tokenizer, chat):
    limits = RolloutConfig(
        max_generate_length=5,
        max_input_length=1024,
        max_sequence_length=2048,
        overlong_filtering=False,
    )
    result, _, _ = await _play(tokenizer, chat, by_turn(ANSWER + " because"), limits=limits)
    assert result.stop_reason == "length"
    assert sum(result.loss_mask) == 5


async def test_cut_turn_that_the_env_continues_is_closed_by_a_non_policy_eos(tokenizer, chat):
    tail = " and then some more words"
    n_call = len(_encode(tokenizer, TOOL_CALL))
    limits = RolloutConfig(
        max_generate_length=n_call + 2, max_input_length=1024, max_sequence_length=2048
    )
    result, _, _ = await _play(tokenizer, chat, by_turn(TOOL_CALL + tail, ANSWER), limits=limits)
    assert result.turn_finish_reasons == ["length", "stop"]
    assert (result.stop_reason, result.reward) == ("stop", 1.0)
    first_turn_end = result.prompt_len + n_call + 2
    closing = first_turn_end  # the appended EOS right after the cut turn
    assert result.token_ids[closing] == tokenizer.eos_token_id
    assert result.loss_mask[closing] == 0
    assert result.versions[closing] == -1
    assert result.logprobs[closing] == 0.0
    assert result.loss_mask[closing - 1] == 1
    delta = _encode(tokenizer, observation_delta([{"role": "tool", "content": "42"}]))
    assert result.token_ids[closing + 1 : closing + 1 + len(delta)] == delta


async def test_max_turns_ends_after_the_last_allowed_turn(tokenizer, chat):
    limits = RolloutConfig(max_turns=3, max_input_length=1024, max_sequence_length=2048)
    result, engine, env = await _play(tokenizer, chat, by_turn(TOOL_CALL), limits=limits)
    assert (result.stop_reason, result.num_turns, result.reward) == ("max_turns", 3, 0.0)
    assert len(engine.calls) == 3
    assert result.token_ids[-1] == tokenizer.eos_token_id  # no observation after the last turn
    assert sum(result.loss_mask) == 3 * (len(_encode(tokenizer, TOOL_CALL)) + 1)
    assert env.sessions[0].closed


async def test_context_over_max_input_length_ends_the_episode(tokenizer, chat):
    prompt_len = len(chat.prompt_ids(_task().prompt, ADD_TOOL))
    limits = RolloutConfig(max_input_length=prompt_len + 5, max_sequence_length=2048)
    result, engine, _ = await _play(tokenizer, chat, by_turn(TOOL_CALL, ANSWER), limits=limits)
    assert (result.stop_reason, result.num_turns) == ("max_input_length", 1)
    assert len(engine.calls) == 1
    assert sum(result.loss_mask) == 0  # cut short by a length limit: filtered


async def test_prompt_longer_than_max_input_length_rejects_the_task(tokenizer, chat):
    limits = RolloutConfig(max_input_length=10, max_sequence_length=2048)
    with pytest.raises(TaskRejected, match="exceeds max_input_length 10"):
        await _play(tokenizer, chat, by_turn(ANSWER), limits=limits)


async def test_generation_is_capped_to_fit_max_sequence_length(tokenizer, chat):
    prompt_len = len(chat.prompt_ids(_task().prompt, ADD_TOOL))
    limits = RolloutConfig(max_input_length=prompt_len, max_sequence_length=prompt_len + 4)
    result, engine, _ = await _play(tokenizer, chat, by_turn(ANSWER), limits=limits)
    assert engine.calls[0].turn.max_tokens == 4
    assert result.stop_reason == "overlong"
    assert len(result.token_ids) == prompt_len + 4
    assert sum(result.loss_mask) == 0


async def test_observation_past_max_sequence_length_is_truncated(tokenizer, chat):
    prompt_len = len(chat.prompt_ids(_task().prompt, ADD_TOOL))
    n_turn = len(_encode(tokenizer, TOOL_CALL)) + 1
    limits = RolloutConfig(max_input_length=prompt_len, max_sequence_length=prompt_len + n_turn + 3)
    result, _, _ = await _play(tokenizer, chat, by_turn(TOOL_CALL, ANSWER), limits=limits)
    assert result.stop_reason == "overlong"
    assert len(result.token_ids) == limits.max_sequence_length
    assert len(result.versions) == len(result.logprobs) == len(result.loss_mask)
    assert sum(result.loss_mask) == 0


async def test_down_env_server_is_skipped_for_another_address(tokenizer, chat):
    env = InProcessEnv(("env-a", "env-b"))
    env.down.add("env-a")
    result, _, _ = await _play(tokenizer, chat, by_turn(TOOL_CALL, ANSWER), env=env)
    assert (result.stop_reason, result.reward, result.num_env_retries) == ("stop", 1.0, 1)
    assert [s.address for s in env.sessions] == ["env-b"]


async def test_all_env_servers_down_ends_with_an_error_not_a_reward(tokenizer, chat):
    env = InProcessEnv(("env-a", "env-b"))
    env.down.update({"env-a", "env-b"})
    result, engine, _ = await _play(tokenizer, chat, by_turn(ANSWER), env=env)
    assert result.stop_reason == "error:env_open"
    assert (result.reward, result.num_turns, result.token_ids) == (0.0, 0, [])
    assert env.num_open_failures == NO_RETRY_DELAY.attempts
    assert engine.calls == []
    assert "attempts failed" in result.error


async def test_server_lost_mid_episode_is_replayed_on_another(tokenizer, chat):
    env = InProcessEnv(("env-a", "env-b"))
    replies = by_turn(TOOL_CALL, ANSWER)

    def script(prompt_text):
        reply = replies(prompt_text)
        if reply == ANSWER:
            env.down.add("env-a")  # the server holding the session dies before turn 2's step
        return reply

    result, _, _ = await _play(tokenizer, chat, script, env=env)
    assert (result.stop_reason, result.reward, result.num_turns) == ("stop", 1.0, 2)
    assert result.num_env_retries == 1
    first, second = env.sessions
    assert (first.address, second.address) == ("env-a", "env-b")
    assert second.actions == [TOOL_CALL, ANSWER]  # replayed, then stepped
    assert first.closed and second.closed


async def test_all_servers_lost_mid_episode_ends_with_env_step_error(tokenizer, chat):
    env = InProcessEnv(("env-a", "env-b"))
    replies = by_turn(TOOL_CALL, ANSWER)

    def script(prompt_text):
        reply = replies(prompt_text)
        if reply == ANSWER:
            env.down.update({"env-a", "env-b"})
        return reply

    result, _, _ = await _play(tokenizer, chat, script, env=env)
    assert result.stop_reason == "error:env_step"
    assert result.reward == 0.0 and sum(result.loss_mask) == 0
    assert result.num_turns == 2  # the tokens generated so far stay, masked out
    assert all(s.closed for s in env.sessions)


class _NanRewardCalculator(CalculatorEnv):
    async def score_answer(self, answer: str) -> float:
        return math.nan  # a broken reward function


class _NanRewardProvider(CalculatorProvider):
    def make(self):
        return _NanRewardCalculator()


async def test_a_non_finite_reward_ends_the_episode_as_an_error(tokenizer, chat):
    env = InProcessEnv(providers={"calculator": _NanRewardProvider()})
    result, _, _ = await _play(tokenizer, chat, by_turn(TOOL_CALL, ANSWER), env=env)
    assert result.stop_reason == "error:env_reward" and "nan" in result.error
    assert result.reward == 0.0 and sum(result.loss_mask) == 0  # never trained on
    assert all(s.closed for s in env.sessions)


async def test_unknown_env_class_rejects_the_task(tokenizer, chat):
    with pytest.raises(TaskRejected, match="unknown env_class"):
        await _play(tokenizer, chat, by_turn(ANSWER), task=_task(env_class="chess"))


def test_malformed_tasks_are_rejected_with_reasons():
    validate_task(_task())
    with pytest.raises(TaskRejected, match="group_size 0"):
        validate_task(_task(group_size=0))
    empty = PromptTask(task_id="x", step=0, group_size=1, env_class="calculator", prompt=[])
    with pytest.raises(TaskRejected, match="prompt: expected a non-empty list"):
        validate_task(empty)
    no_env = PromptTask(task_id="x", step=0, group_size=1, env_class="", prompt=[])
    with pytest.raises(TaskRejected, match="env_class: must not be empty"):
        validate_task(no_env)
    no_role = _task().prompt[:1] + [{"content": "hi"}]
    with pytest.raises(TaskRejected, match=r"prompt\[1\].role: expected a string"):
        validate_task(msgspec.structs.replace(_task(), prompt=no_role))


async def test_group_runs_its_samples_concurrently_with_distinct_seeds(tokenizer, chat):
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER), delay_s=0.01)
    env = InProcessEnv()
    results = await run_group(
        Rollout(
            engine=engine,
            env=env,
            chat=chat,
            limits=LIMITS,
            sampling=SamplingConfig(seed=100),
            env_config=NO_RETRY_DELAY,
        ),
        _task(group_size=4),
    )
    assert [r.reward for r in results] == [1.0] * 4
    assert engine.max_in_flight == 4
    assert sorted({call.turn.seed for call in engine.calls}) == [100, 101, 102, 103]
    assert len(env.sessions) == 4 and env.num_closed == 4


async def test_a_group_the_env_servers_failed_is_one_warning_line(tokenizer, chat, caplog):
    env = InProcessEnv(("env-a", "env-b"))
    env.down.update({"env-a", "env-b"})
    rollout = Rollout(
        engine=ScriptedEngine(tokenizer, by_turn(ANSWER)),
        env=env,
        chat=chat,
        limits=LIMITS,
        sampling=SamplingConfig(),
        env_config=NO_RETRY_DELAY,
    )
    with caplog.at_level(logging.WARNING, logger="actors"):
        results = await run_group(rollout, _task(task_id="t9", group_size=4))
    assert [r.stop_reason for r in results] == ["error:env_open"] * 4
    assert [r.getMessage() for r in caplog.records] == [
        f"task t9: 4 of 4 samples ended with an env error (error:env_open x4); "
        f"sample 0: {results[0].error}"
    ]


def test_the_failed_group_line_counts_each_stop_reason():
    results = [
        EpisodeResult(stop_reason="stop", reward=1.0),
        EpisodeResult(stop_reason="error:env_step", error="env-b: connection reset"),
        EpisodeResult(stop_reason="error:env_reward", error="the env returned reward nan"),
        EpisodeResult(stop_reason="error:env_step", error="env-a: connection reset"),
    ]
    assert failed_samples_line("t2", results) == (
        "task t2: 3 of 4 samples ended with an env error (error:env_reward x1, "
        "error:env_step x2); sample 1: env-b: connection reset"
    )
    assert failed_samples_line("t2", results[:1]) is None


async def test_group_with_too_long_prompt_is_rejected_and_cleaned_up(tokenizer, chat):
    env = InProcessEnv()
    with pytest.raises(TaskRejected, match="max_input_length"):
        await run_group(
            Rollout(
                engine=ScriptedEngine(tokenizer, by_turn(ANSWER)),
                env=env,
                chat=chat,
                limits=RolloutConfig(max_input_length=10, max_sequence_length=100),
                sampling=SamplingConfig(),
                env_config=NO_RETRY_DELAY,
            ),
            _task(group_size=3),
        )
    assert env.num_closed == len(env.sessions)


async def test_trajectory_carries_the_episode_byte_for_byte(tokenizer, chat):
    result, _, _ = await _play(tokenizer, chat, by_turn(TOOL_CALL, ANSWER), version=2)
    task = _task(group_size=4)
    trajectory = to_trajectory(result, task=task, sample_index=3, actor_id="replica-0")
    trajectory = decode(encode(trajectory), Trajectory)
    arrays = token_arrays(trajectory)
    assert arrays.token_ids.tolist() == result.token_ids
    assert arrays.loss_mask.tolist() == result.loss_mask
    assert arrays.versions.tolist() == result.versions
    assert arrays.logprobs.tolist() == result.logprobs  # multiples of 1/8: exact in float32
    assert trajectory.trajectory_id == "t1/3"
    assert (trajectory.group_id, trajectory.group_size, trajectory.sample_index) == ("t1", 4, 3)
    assert (trajectory.step, trajectory.actor_id, trajectory.prompt_len) == (
        3,
        "replica-0",
        result.prompt_len,
    )
    assert (trajectory.reward, trajectory.stop_reason, trajectory.num_turns) == (1.0, "stop", 2)
    assert trajectory.num_tool_calls == 1
    assert (trajectory.env_class, trajectory.data_source, trajectory.is_eval) == (
        task.env_class,
        task.data_source,
        task.is_eval,
    )
    assert set(trajectory.timing) == {"generate_s", "env_s", "start", "end"}


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_turns"):
        RolloutConfig(max_turns=0)
    with pytest.raises(ValueError, match="must not exceed max_sequence_length"):
        RolloutConfig(max_input_length=100, max_sequence_length=50)


async def test_ids_the_tokenizer_cannot_decode_are_counted_and_said_once(tokenizer, chat, caplog):
    """The scale ladder's probe (bench/scale.py): a random model with Qwen's 151,936
    embedding rows and the demo's 434-token tokenizer samples ids that decode to nothing;
    the env sees no text and every episode runs to its limit. The actor now says why, once,
    and counts them."""
    from actors import metrics
    from actors.types import Generation

    class BeyondTheVocabulary(ScriptedEngine):
        async def generate(self, prompt_token_ids, turn):
            ids = [len(tokenizer) + i for i in range(turn.max_tokens)]
            return Generation(ids, [-1.0] * len(ids), "length", [0] * len(ids))

    said_before = metrics._said_undecodable
    metrics._said_undecodable = False
    before = metrics.UNDECODABLE_TOKENS._value.get()
    try:
        limits = RolloutConfig(max_turns=2, max_input_length=1024, max_generate_length=8,
                               max_sequence_length=2048)  # fmt: skip
        for _ in range(2):
            result = await run_episode(
                Rollout(
                    engine=BeyondTheVocabulary(tokenizer, by_turn(ANSWER)),
                    env=InProcessEnv(),
                    chat=chat,
                    limits=limits,
                    sampling=SamplingConfig(temperature=1.0),
                    env_config=NO_RETRY_DELAY,
                ),  # fmt: skip
                _task(),
            )
            assert result.num_turns >= 1
    finally:
        metrics._said_undecodable = said_before
    assert chat.num_tokens == len(tokenizer)
    assert metrics.UNDECODABLE_TOKENS._value.get() - before >= 16
    said = [r.message for r in caplog.records if "tokenizer has no token for" in r.message]
    assert len(said) == 1 and f"at or past {len(tokenizer)}" in said[0]
