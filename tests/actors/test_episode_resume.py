"""Turn-level episode checkpoints (actors/resume.py), on a scripted engine and the in-process
calculator env: an episode recorded after a turn and continued on another engine is, token
for token, the episode played whole; the rules that refuse a checkpoint start it over and
say why; a group skips the samples marked stored."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout, run_episode
from actors.episode_checkpoints import GroupCheckpoints
from actors.group import run_group
from actors.resume import checkpoint_of, resume_refusal
from broker.codec import WireDecodeError, decode, encode, token_arrays
from broker.wire import EpisodeCheckpoint, PromptTask
from demo.data import SYSTEM_PROMPT
from demo.tokenizer import build_tokenizer
from tests.fakes import InProcessEnv, ScriptedEngine, by_turn

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
ANSWER = "<answer>42</answer>"
SCRIPT = (TOOL_CALL, TOOL_CALL, ANSWER)  # three turns: two tool calls, then the answer
LIMITS = RolloutConfig(
    max_turns=4, max_input_length=1024, max_generate_length=64, max_sequence_length=2048
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


def _task(*, question="What is 17 + 25?", min_version=0, group_size=1) -> PromptTask:
    return PromptTask(
        task_id="run-1/k/3",
        step=3,
        min_version=min_version,
        group_size=group_size,
        env_class="calculator",
        data_source="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        reward_spec={"method": "rule", "ground_truth": "42"},
        extra_info={"task_key": "k", "tools": ["add"]},
    )


def _rollout(tokenizer, engine, env=None) -> Rollout:
    return Rollout(
        engine=engine,
        env=env or InProcessEnv(),
        chat=ChatTemplate(tokenizer),
        limits=LIMITS,
        sampling=SamplingConfig(temperature=1.0),
        env_config=EnvConfig(attempts=2, backoff_s=0.0),
    )


async def _recorded(tokenizer, task, *, version=0):
    """The episode played whole, and its checkpoint after each turn that did not end it
    (through the wire codec, as the broker keeps them)."""
    checkpoints: list[EpisodeCheckpoint] = []

    async def on_turn(episode) -> None:
        cp = checkpoint_of(task, 0, episode.result, episode.actions, episode.observations)
        checkpoints.append(decode(encode(cp), EpisodeCheckpoint))

    engine = ScriptedEngine(tokenizer, by_turn(*SCRIPT), version=version)
    result = await run_episode(_rollout(tokenizer, engine), task, on_turn=on_turn)
    return result, checkpoints


def _same_episode(a, b) -> None:
    for name in ("token_ids", "logprobs", "loss_mask", "versions", "prompt_len", "reward"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.stop_reason, a.num_turns, a.num_tool_calls) == (b.stop_reason, 3, 2)


@pytest.mark.parametrize("after_turn", [1, 2])
async def test_an_episode_continued_from_a_turn_is_the_episode_played_whole(tokenizer, after_turn):
    task = _task()
    whole, checkpoints = await _recorded(tokenizer, task)
    assert [c.num_turns for c in checkpoints] == [1, 2]
    saved = checkpoints[after_turn - 1]
    other = ScriptedEngine(tokenizer, by_turn(*SCRIPT))
    env = InProcessEnv()
    resumed = await run_episode(_rollout(tokenizer, other, env), task, saved=saved)
    _same_episode(resumed, whole)
    # Only the turns after the checkpoint were generated, from the recorded tokens on.
    assert len(other.calls) == 3 - after_turn
    assert other.calls[0].prompt_token_ids == token_arrays(saved).token_ids.tolist()
    assert resumed.resumed_turns == after_turn and resumed.resume_refused == ""
    policy = [v for v in token_arrays(saved).versions.tolist() if v >= 0]
    assert resumed.resumed_tokens == len(policy) > 0
    # The env session was rebuilt by replaying the recorded actions, then stepped on.
    (session,) = env.sessions
    assert session.actions == [TOOL_CALL, TOOL_CALL, ANSWER]
    assert session.closed


async def test_the_rules_refuse_tokens_of_another_policy_and_say_why(tokenizer):
    task = _task()
    _, checkpoints = await _recorded(tokenizer, task, version=5)
    saved = checkpoints[0]
    assert resume_refusal(saved, task, engine_version=5) is None
    assert resume_refusal(saved, task, engine_version=4) == "ahead"  # a rolled-back history
    assert resume_refusal(saved, _task(min_version=6), engine_version=7) == "stale"
    # Refused: played from its first token on this engine, and counted.
    engine = ScriptedEngine(tokenizer, by_turn(*SCRIPT), version=4)
    result = await run_episode(_rollout(tokenizer, engine), task, saved=saved)
    assert result.resume_refused == "ahead" and result.resumed_turns == 0
    assert len(engine.calls) == 3 and set(v for v in result.versions if v >= 0) == {4}


async def test_an_env_that_does_not_give_back_the_recording_starts_the_episode_over(tokenizer):
    task = _task()
    whole, checkpoints = await _recorded(tokenizer, task)
    saved = checkpoints[0]
    cases = {
        "prompt": (_task(question="What is 17 + 26?"), saved),
        "replay": (
            task,
            msgspec.structs.replace(saved, observations=[[{"role": "tool", "content": "41"}]]),
        ),
    }
    for reason, (asked, checkpoint) in cases.items():
        engine = ScriptedEngine(tokenizer, by_turn(*SCRIPT))
        env = InProcessEnv()
        result = await run_episode(_rollout(tokenizer, engine, env), asked, saved=checkpoint)
        assert result.resume_refused == reason and result.resumed_turns == 0
        assert len(engine.calls) == 3
        assert all(s.closed for s in env.sessions)  # the replay's session too
        if reason == "replay":
            _same_episode(result, whole)
    # An env server failing during the replay: the episode starts over on another one.
    engine = ScriptedEngine(tokenizer, by_turn(*SCRIPT))
    env = InProcessEnv(addresses=("env-a", "env-b"))  # opens alternate: a, then b
    real_open = env.open

    async def open_then_fail(env_class, row):
        session = await real_open(env_class, row)
        if session.address == "env-a":
            env.down.add("env-a")  # it fails once the session is open: during the replay
        return session

    env.open = open_then_fail
    result = await run_episode(_rollout(tokenizer, engine, env), task, saved=saved)
    assert result.resume_refused == "env" and result.stop_reason == "stop"
    _same_episode(result, whole)


def test_a_checkpoint_whose_history_does_not_pair_up_is_refused_on_decode(tokenizer):
    saved = EpisodeCheckpoint(task_id="t", sample_index=0, num_turns=2, actions=["a"])
    with pytest.raises(WireDecodeError, match="2 turns with 1 actions and 0 observations"):
        decode(encode(saved), EpisodeCheckpoint)
    torn = EpisodeCheckpoint(task_id="t", sample_index=0, token_ids=b"\x01\x00\x00\x00")
    with pytest.raises(WireDecodeError, match="logprobs has 0 bytes for 1 tokens"):
        decode(encode(torn), EpisodeCheckpoint)


async def test_a_group_skips_stored_samples_and_continues_the_others(tokenizer):
    task = _task(group_size=3)
    _, checkpoints = await _recorded(tokenizer, _task())
    saved = {
        0: EpisodeCheckpoint(task_id=task.task_id, sample_index=0, stored=True),
        2: msgspec.structs.replace(checkpoints[1], sample_index=2),
    }
    engine = ScriptedEngine(tokenizer, by_turn(*SCRIPT))
    published = []

    async def on_result(index, result):
        published.append((index, result.resumed_turns))

    results = await run_group(_rollout(tokenizer, engine), task, on_result=on_result, saved=saved)
    assert sorted(published) == [(1, 0), (2, 2)] and len(results) == 2
    assert len(engine.calls) == 3 + 1  # sample 1 whole, sample 2 its last turn


class _SlowStore:
    """An EpisodeStore whose puts wait until released (a broker that is restarting)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.records: list[EpisodeCheckpoint] = []

    async def record(self, checkpoint: EpisodeCheckpoint) -> bool:
        await self.release.wait()
        self.records.append(checkpoint)
        return True

    async def mark_stored(self, task_id: str, index: int, actor_id: str = "") -> bool:
        self.records.append(EpisodeCheckpoint(task_id=task_id, sample_index=index, stored=True))
        return True


async def test_recording_a_checkpoint_never_holds_the_episode_up(tokenizer):
    store, task = _SlowStore(), _task()
    checkpoints = GroupCheckpoints(store, task, "a0")
    engine = ScriptedEngine(tokenizer, by_turn(*SCRIPT))

    async def on_turn(episode) -> None:
        await checkpoints.on_turn(0, episode)

    result = await asyncio.wait_for(
        run_episode(_rollout(tokenizer, engine), task, on_turn=on_turn), timeout=10
    )
    assert result.num_turns == 3 and store.records == []  # played through, puts waiting
    marked = asyncio.create_task(checkpoints.stored(0, result))
    await asyncio.sleep(0.05)
    assert not marked.done()  # the mark waits for the puts in flight
    store.release.set()
    await marked
    # One put in flight at a time, the newest waiting one replacing older ones: the turn-1
    # checkpoint went first, the turn-2 one next, then the mark, in that order.
    assert [(r.num_turns, r.stored) for r in store.records] == [(1, False), (2, False), (0, True)]
