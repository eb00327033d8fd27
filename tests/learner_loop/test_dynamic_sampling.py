"""Dynamic sampling (learner.dynamic_sampling) in the real `learner` CLI, fed by
scripted actors some of whose groups got one reward for every sample: those are filtered
(dropped whole as `filtered`, each replaced by a new prompt), every step still trains
`prompts_per_step` groups, all with signal, and the books balance; past
`max_filtered_per_step` a step takes groups as they come and says so; a learner killed and
resumed with it on keeps its books."""

from __future__ import annotations

from deploy.run_ledger import RunLedger
from tests.learner_loop.conftest import bus, running
from tests.learner_loop.scripted_actor import RESUMABLE, ScriptedActor
from tests.learner_loop.test_learner_process import (
    TIMEOUT_S,
    _assert_every_trajectory_accounted_for,
    _training_groups,
)


async def _run(run, nats_server, bus_names, *, flat_every: tuple[int, int]):
    actors = [
        ScriptedActor(nats_server.url, bus_names, actor_id=f"a{i}", delay_s=0.02 * (i + 1),
                      seed=i + 1, flat_every=k)
        for i, k in enumerate(flat_every)
    ]  # fmt: skip
    async with bus(nats_server.url, bus_names), running(actors):
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()
    return actors


async def _killed_and_resumed(
    run, nats_server, bus_names, *, flat_every: int, at: int, slow_delay_s: float = 0.15
):
    """The learner run to its end, killed once version `at` is announced and started again,
    fed by two resumable scripted actors (a fast one and one of `slow_delay_s`)."""
    actors = [
        ScriptedActor(nats_server.url, bus_names, actor_id=name, delay_s=delay, seed=seed,
                      flat_every=flat_every, **RESUMABLE)
        for name, delay, seed in (("a", 0.02, 7), ("b", slow_delay_s, 8))
    ]  # fmt: skip
    async with bus(nats_server.url, bus_names) as (_, versions), running(actors):
        await run.start()
        await run.kill_at(versions, at)
        await run.start()
        assert await run.wait(TIMEOUT_S) == 0, run.log_tail()
    return actors


async def test_groups_without_signal_are_filtered_and_replaced(learner_run, nats_server, bus_names):
    run = learner_run(total_steps=4, max_staleness=1, prompts_per_step=2, dynamic_sampling=True)
    actors = await _run(run, nats_server, bus_names, flat_every=(2, 3))

    trained_lines, dropped_lines = _assert_every_trajectory_accounted_for(run, actors)
    assert RunLedger.read(run.run_dir).problems() == []
    flat = {gid for gid, g in _training_groups(actors).items() if g.flat}
    filtered = [d for d in dropped_lines if d["reason"] == "filtered"]
    assert filtered and all(d["whole_group"] for d in filtered)
    assert {d["group_id"] for d in filtered} <= flat
    trained = [gid for line in trained_lines for gid in line["group_ids"]]
    assert not set(trained) & flat  # every trained group had signal
    assert all(len(line["group_ids"]) == 2 for line in trained_lines)
    train = run.records("train")
    assert sum(r["filtered_groups"] for r in train) == len(filtered)
    (done,) = run.records("done")
    # The books keep them apart from the drops: stored = trained + dropped + filtered + eval.
    assert done["filtered"] == sum(len(d["trajectory_ids"]) for d in filtered)
    assert "filtered" not in done["dropped_by_reason"]
    assert RunLedger.read(run.run_dir).summary()["filtered"] == done["filtered"]
    # Each group dropped whole before the end earned a replacement: 4 steps x 2, plus those
    # (the drain's `unused`, after the last release, earn none).
    replaced = {
        d["group_id"] for d in dropped_lines if d["whole_group"] and d["reason"] != "unused"
    }
    assert done["released_groups"] == 8 + len(replaced)


async def test_past_the_cap_a_step_takes_groups_as_they_come(learner_run, nats_server, bus_names):
    run = learner_run(
        total_steps=3,
        max_staleness=1,
        prompts_per_step=2,
        dynamic_sampling=True,
        max_filtered_per_step=1,
    )
    actors = await _run(run, nats_server, bus_names, flat_every=(1, 1))  # no signal anywhere

    _assert_every_trajectory_accounted_for(run, actors)
    assert RunLedger.read(run.run_dir).problems() == []
    assert [r["filtered_groups"] for r in run.records("train")] == [1, 1, 1]
    assert "the most learner.max_filtered_per_step allows" in run.log_tail(200_000)


async def test_a_resumed_learner_filters_on_with_its_books_whole(
    learner_run, nats_server, bus_names
):
    run = learner_run(total_steps=6, max_staleness=1, prompts_per_step=2, dynamic_sampling=True)
    actors = await _killed_and_resumed(run, nats_server, bus_names, flat_every=2, at=3)

    trained_lines, dropped_lines = _assert_every_trajectory_accounted_for(run, actors)
    assert RunLedger.read(run.run_dir).problems() == []
    assert [line["step"] for line in trained_lines] == list(range(6))
    flat = {gid for gid, g in _training_groups(actors).items() if g.flat}
    assert not {gid for line in trained_lines for gid in line["group_ids"]} & flat
    assert any(d["reason"] == "filtered" for d in dropped_lines)


async def test_difficulty_filtering_passes_over_saturated_prompts_across_a_resume(
    learner_run, nats_server, bus_names
):
    """learner.difficulty on, every group without signal (12 dataset rows, window 1): from
    the second epoch on the stream passes over most rows; a learner killed and resumed keeps
    its books and its count of prompts passed over."""
    fields = {"difficulty.enabled": True, "difficulty.window": 1, "difficulty.keep": 0.25}
    run = learner_run(total_steps=12, max_staleness=1, prompts_per_step=2, **fields)
    actors = await _killed_and_resumed(
        run, nats_server, bus_names, flat_every=1, at=8, slow_delay_s=0.1
    )

    trained_lines, _ = _assert_every_trajectory_accounted_for(run, actors)
    assert RunLedger.read(run.run_dir).problems() == []
    assert [line["step"] for line in trained_lines] == list(range(12))
    train = run.records("train")
    skipped = [r["prompts_skipped"] for r in train]
    assert skipped == sorted(skipped) and skipped[-1] > 0  # counted on across the resume
    assert train[-1]["difficulty/saturated/calculator"] == 1.0
