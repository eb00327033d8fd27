"""The real `learner` CLI against a real nats-server, fed by scripted actors (no model on
the actor side; a tiny random Qwen2 in the learner).

What the learner wrote (metrics.jsonl, trained.jsonl, dropped.jsonl, the KV) is checked
against what the actors know they did: which tasks they saw, which groups they published
with which versions.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from deploy.run_ledger import RunLedger
from learner.trainer.checkpoint import latest_checkpoint, read_training_state
from tests.learner_loop.conftest import bus, running
from tests.learner_loop.scripted_actor import RESUMABLE, ScriptedActor, resumable_pair

TIMEOUT_S = 150


def _training_groups(actors) -> dict[str, object]:
    """group id -> PublishedGroup, over every actor's training (non-eval) publishes. A group
    published twice is a task redelivered after its ack was lost (a broker restart): the
    same trajectory ids, of which the stream kept the first copy (deduplicated by id)."""
    groups = {}
    publishes = sorted((g for a in actors for g in a.published), key=lambda g: g.published_at)
    for g in publishes:
        if not g.is_eval:
            first = groups.setdefault(g.group_id, g)
            assert first.trajectory_ids == g.trajectory_ids, f"group {g.group_id} differs"
    return groups


def _assert_every_trajectory_accounted_for(run, actors) -> tuple[list[dict], list[dict]]:
    """trained.jsonl + dropped.jsonl hold every published training trajectory exactly once,
    and the done record's totals agree. Returns (trained lines, dropped lines)."""
    published = {i for g in _training_groups(actors).values() for i in g.trajectory_ids}
    trained_lines = run.history("trained.jsonl")
    dropped_lines = run.history("dropped.jsonl")
    trained = Counter(i for line in trained_lines for i in line["trajectory_ids"])
    dropped = Counter(i for line in dropped_lines for i in line["trajectory_ids"])
    assert max(trained.values(), default=1) == 1, "a trajectory was trained twice"
    assert max(dropped.values(), default=1) == 1, "a trajectory was dropped twice"
    assert not set(trained) & set(dropped)
    assert set(trained) | set(dropped) == published
    (done,) = run.records("done")
    assert done["trained"] == len(trained)
    assert done["dropped"] + done["filtered"] == len(dropped)  # filtered: dynamic sampling
    assert done["trained"] + done["dropped"] + done["filtered"] == len(published)
    assert sum(done["dropped_by_reason"].values()) == done["dropped"]
    return trained_lines, dropped_lines


def _assert_trained_within_bound(trained_lines, actors, max_staleness: int | None) -> None:
    """Step s trains on tokens of version >= s - max_staleness, never newer than s; None:
    the bound each group was released under."""
    groups = _training_groups(actors).values()
    version_of = {i: g.version for g in groups for i in g.trajectory_ids}
    bound_of = {i: g.max_staleness for g in groups for i in g.trajectory_ids}
    for line in trained_lines:
        for i in line["trajectory_ids"]:
            bound = bound_of[i] if max_staleness is None else max_staleness
            assert line["step"] - bound <= version_of[i] <= line["step"], (line, i, bound)


async def _scrape_policy_version(run) -> str:
    """The learner's /metrics text once it shows a policy version >= 1."""
    while run.process.returncode is None:
        try:
            text = await asyncio.to_thread(run.scrape)
        except OSError:  # not listening yet
            text = ""
        for line in text.splitlines():
            if line.startswith("tether_learner_policy_version ") and float(line.split()[1]) >= 1:
                return text
        await asyncio.sleep(0.2)
    raise AssertionError(f"learner exited before serving a version:\n{run.log_tail()}")


async def test_learner_trains_evaluates_and_accounts_for_every_trajectory(
    learner_run, nats_server, bus_names
):
    run = learner_run(total_steps=6, max_staleness=1, eval_interval=3)
    actors = [
        # an agent's episodes of two conversations each (a solver and a critic)
        ScriptedActor(nats_server.url, bus_names, actor_id="fast", delay_s=0.02, seed=1,
                      conversations=2),
        ScriptedActor(nats_server.url, bus_names, actor_id="slower", delay_s=0.3, seed=2),
    ]  # fmt: skip
    async with bus(nats_server.url, bus_names) as (js, versions), running(actors):
        await run.start()
        metrics_text = await _scrape_policy_version(run)
        code = await run.wait(TIMEOUT_S)
        info = await js.stream_info(bus_names.trajectories.stream)
    assert code == 0, run.log_tail()

    assert versions.versions == list(range(7))  # announced 0 at start, then once per step
    train = run.records("train")
    assert [(r["step"], r["version"]) for r in train] == [(s, s + 1) for s in range(6)]
    assert all(r["num_tokens"] > 0 and r["train/num_sequences"] >= 2 for r in train)
    evals = run.records("eval")
    assert sorted(r["version"] for r in evals) == [0, 3, 6]
    assert all(0.0 <= r["pass_at_1"] <= 1.0 and r["num_prompts"] == 2 for r in evals)
    dump = run.run_dir / "evals" / "global_step_3" / "calculator.jsonl"
    assert len(dump.read_text().splitlines()) == 2 * 2  # 2 prompts x 2 samples

    trained_lines, _ = _assert_every_trajectory_accounted_for(run, actors)
    _assert_trained_within_bound(trained_lines, actors, max_staleness=1)
    # Each conversation of an episode is a sequence of its own in the loss.
    conversations = {i: a.conversations for a in actors for g in a.published
                     for i in g.trajectory_ids}  # fmt: skip
    sequences = {line["step"]: sum(conversations[i] for i in line["trajectory_ids"])
                 for line in trained_lines}  # fmt: skip
    assert {r["step"]: r["train/num_sequences"] for r in train} == sequences
    assert any(conversations[i] == 2 for line in trained_lines for i in line["trajectory_ids"])
    (done,) = run.records("done")
    assert done["outstanding_groups"] == 0
    # The stream stored each published trajectory (training and eval) exactly once.
    num_published = sum(len(g.trajectory_ids) for a in actors for g in a.published)
    assert info.state.last_seq == num_published
    assert both_actors_worked(actors)
    assert "tether_learner_policy_version" in metrics_text
    assert "tether_learner_trained_trajectories_total" in metrics_text
    # The loop's queue-depth poll (learner/bus_metrics.py) read the run's streams.
    assert 'tether_bus_stream_max_bytes{queue="trajectories"}' in metrics_text


def both_actors_worked(actors) -> bool:
    """Each actor published something (a training or an eval group): the run had two."""
    return all(a.published for a in actors)


async def test_staleness_bound_holds_with_a_lagging_actor(learner_run, nats_server, bus_names):
    # The laggard's weights trail the announced version by 2 > max_staleness: everything it
    # publishes is certainly too stale by the time the learner sees it.
    # Near the end it could wait forever for a version that never comes (the last step's
    # prompts are all the learner has left to wait for): it hands such tasks back.
    run = learner_run(total_steps=8, max_staleness=1, eval_interval=None)
    fast = ScriptedActor(nats_server.url, bus_names, actor_id="fast", delay_s=0.02, seed=3)
    laggard = ScriptedActor(
        nats_server.url, bus_names, actor_id="laggard", lag=2, patience_s=2.0, seed=4
    )
    async with bus(nats_server.url, bus_names) as (js, versions), running([fast, laggard]):
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()

    trained_lines, dropped_lines = _assert_every_trajectory_accounted_for(run, [fast, laggard])
    _assert_trained_within_bound(trained_lines, [fast, laggard], max_staleness=1)
    late = {g.group_id: g for g in laggard.published if not g.is_eval}
    assert late, "the laggard never published: the test would prove nothing"
    assert all(g.announced_at_publish - g.version > 1 for g in late.values())
    # Exactly the laggard's groups were dropped as stale, each for a reason the tags show.
    stale = [line for line in dropped_lines if line["reason"] == "stale"]
    assert {line["group_id"] for line in stale} == set(late)
    for line in stale:
        assert late[line["group_id"]].version < line["version"] - 1
    (done,) = run.records("done")
    assert done["dropped_by_reason"]["stale"] == sum(len(g.trajectory_ids) for g in late.values())
    assert done["max_staleness_seen"] <= 1


async def test_an_auto_bound_rises_while_the_learner_starves_and_each_group_keeps_its_own(
    learner_run, nats_server, bus_names
):
    # One slow actor: the learner waits on data far longer than it trains, so the bound
    # rises by one every two steps to its limit. The scripted actor's logprobs are no
    # model's, so its PPO health is always off: these limits let the rise be seen. The
    # learner is killed at version 5 and resumes from its checkpoint at 4, bound and all.
    run = learner_run(total_steps=10, max_staleness="auto", max_staleness_limit=3,
                      max_staleness_auto={"max_clip_fraction": 1.0, "max_approx_kl": 1e9},
                      eval_interval=None)  # fmt: skip
    actor = ScriptedActor(nats_server.url, bus_names, actor_id="slow", delay_s=0.4, seed=5,
                          **RESUMABLE)  # fmt: skip
    async with bus(nats_server.url, bus_names) as (js, versions), running([actor]):
        await run.start()
        await run.kill_at(versions, 5)
        saved = read_training_state(latest_checkpoint(run.run_dir / "checkpoints"))
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()
    trained_lines, _ = _assert_every_trajectory_accounted_for(run, [actor])
    records = run.records("train")
    assert [r["version"] for r in records] == list(range(1, 11))
    bounds = [r["max_staleness"] for r in records]
    assert bounds[0] == 1 and max(bounds) == 3, bounds
    assert all(b - a in (0, 1) for a, b in zip(bounds, bounds[1:], strict=False)), bounds
    # The resumed learner's first step ran under the bound the checkpoint saved.
    assert saved.version == 4 and bounds[4] == saved.dataset_cursor["staleness_bound"]["bound"]
    released_under = {g.max_staleness for g in actor.published if not g.is_eval}
    assert released_under >= {1, 2}, released_under  # releases carried the bound of their time
    _assert_trained_within_bound(trained_lines, [actor], max_staleness=None)


async def test_the_token_rule_trains_the_fresh_turns_of_episodes_that_spanned_updates(
    learner_run, nats_server, bus_names
):
    # Every episode's first turn is 3 versions older than its second: from step 2 on, the
    # group rule (max_staleness 1) would drop every group and the run would never end.
    run = learner_run(total_steps=5, max_staleness=1, eval_interval=None,
                      staleness_rule="token", min_fresh_fraction=0.2)  # fmt: skip
    actors = [ScriptedActor(nats_server.url, bus_names, actor_id="spanning", delay_s=0.02,
                            seed=9, first_turn_lag=3)]  # fmt: skip
    async with bus(nats_server.url, bus_names) as (js, versions), running(actors):
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()
    _, dropped_lines = _assert_every_trajectory_accounted_for(run, actors)
    assert [line for line in dropped_lines if line["reason"] == "stale"] == []
    train = run.records("train")
    masked = [r["stale_tokens_masked"] for r in train]
    assert sum(masked) > 0, masked
    assert all(0.0 <= r["stale_token_fraction"] < 1.0 for r in train)
    # Episodes whose first turn lagged 3 versions span up to 3 (and are trained).
    spans = [span for r in train for span in r["version_span"]]
    assert spans and max(spans) >= 1
    (done,) = run.records("done")
    assert done["max_staleness_seen"] <= 1  # of the tokens trained: the stale ones had no loss


async def test_max_staleness_zero_is_synchronous(learner_run, nats_server, bus_names):
    # Also: the weight broadcast switched on with nobody to receive it must not block.
    run = learner_run(
        total_steps=4,
        max_staleness=0,
        eval_interval=None,
        broadcast_weights=True,
        weight_sync={"store_port": 0, "join_timeout_s": 1.0},
    )
    actors = [
        ScriptedActor(nats_server.url, bus_names, actor_id="a", delay_s=0.02, seed=5),
        ScriptedActor(nats_server.url, bus_names, actor_id="b", delay_s=0.1, seed=6),
    ]
    async with bus(nats_server.url, bus_names) as (js, versions), running(actors):
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()

    seen = [t for a in actors for t in a.seen if not t.is_eval]
    assert len(seen) == 4 * 2
    # The version a task needs was announced before the task was released.
    assert all(t.announced_at_receipt >= t.min_version for t in seen)
    trained_lines, dropped_lines = _assert_every_trajectory_accounted_for(run, actors)
    assert dropped_lines == []
    _assert_trained_within_bound(trained_lines, actors, max_staleness=0)
    assert all(g.version == g.step for g in _training_groups(actors).values())
    (done,) = run.records("done")
    assert done["max_staleness_seen"] == 0 and done["dropped"] == 0
    assert versions.versions == list(range(5))
    assert versions.announced[-1].broadcast_addr.startswith("127.0.0.1:")
    assert all(r["broadcast_receivers"] == 0 for r in run.records("train"))


async def test_killed_learner_resumes_without_gap_repeat_or_loss(
    learner_run, nats_server, bus_names, tmp_path
):
    run = learner_run(total_steps=8, max_staleness=1, eval_interval=None)
    actors = resumable_pair(nats_server.url, bus_names)
    async with bus(nats_server.url, bus_names) as (js, versions), running(actors):
        await run.start()
        await run.kill_at(versions, 5)
        checkpoint = latest_checkpoint(run.run_dir / "checkpoints")
        resumed_at = read_training_state(checkpoint).version
        assert resumed_at == 4  # checkpoints every 2 versions; killed at 5 or later
        num_announced = len(versions.versions)
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()

    # The KV went back to the checkpoint's version and counted on from there.
    assert versions.versions[:num_announced] == list(range(num_announced))
    assert versions.versions[num_announced:] == list(range(resumed_at, 9))
    trained_lines, dropped_lines = _assert_every_trajectory_accounted_for(run, actors)
    assert [line["step"] for line in trained_lines] == list(range(8))
    assert [r["version"] for r in run.records("train")] == list(range(1, 9))
    _assert_trained_within_bound(trained_lines, actors, max_staleness=1)
    # After the resume, groups tagged with versions of the lost run are dropped as `future`.
    for line in dropped_lines:
        assert line["reason"] in ("stale", "future", "unused"), line
    # The books balance across the kill: every stored message counted once.
    assert RunLedger.read(run.run_dir).problems() == []


async def test_a_release_written_ahead_but_never_published_is_published_on_resume(
    learner_run, nats_server, bus_names
):
    """The lost learner died between writing a release ahead (`dispatcher.json`) and
    publishing its prompts: the successor, which waits for every group released, must
    publish them itself (once: the stream stores a task id once) or wait for ever."""
    run = learner_run(total_steps=3, max_staleness=1, eval_interval=None)
    checkpoints = run.run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    ahead = {"run_id": "lost-run", "num_released": 4}  # steps 0 and 1
    (checkpoints / "dispatcher.json").write_text(json.dumps(ahead))
    actors = resumable_pair(nats_server.url, bus_names)
    async with bus(nats_server.url, bus_names) as (js, versions), running(actors):
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()
    trained_lines, dropped_lines = _assert_every_trajectory_accounted_for(run, actors)
    assert [line["step"] for line in trained_lines] == [0, 1, 2]
    seen = {t.task_id for a in actors for t in a.seen if not t.is_eval}
    # Tasks 0-3 were only written ahead, 4-5 released by this learner; each group dropped
    # (stale, with a slow actor) has one replacement after them.
    replacements = len({d["group_id"] for d in dropped_lines if d["whole_group"]})
    # The lost run's id carries on, so a republished task is stored once.
    assert seen == {f"lost-run-{i}" for i in range(6 + replacements)}
