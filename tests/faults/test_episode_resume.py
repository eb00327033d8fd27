"""An actor replica SIGKILLed mid-episode (docs/reliability.md), on real parts only
(deploy/resume_scenario.py: a nats-server, the calculator env server with a slow tool, so an
episode spans seconds, `actor --replicas 2` with real vLLM engines on the shipped
warm-start model, which calls the `add` tool). The replica that recorded the first episode
checkpoint with a turn is killed. Its tasks come back after the ack wait; each of its
unfinished samples must continue on the other replica from its last recorded turn (counted
in the trajectory), and its trajectory must begin with exactly the tokens, logprobs, loss
mask and versions the dead replica generated. Nothing else is resumed.

Then the same replica told to leave instead (SIGTERM with a 10 s grace: a scale-in, a
preemption notice): every episode it had not finished stops at its next turn boundary and
goes on on the other replica from exactly there; of what it generated nothing is lost and
nothing is generated again."""

from __future__ import annotations

import re
import signal

import numpy as np
import pytest

from broker.codec import token_arrays
from deploy.resume_scenario import run_scenario

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def test_a_killed_replicas_episodes_continue_from_their_last_turn(tmp_path):
    outcome = await run_scenario(tmp_path, group_size=8, num_tasks=2)
    assert outcome.last_of_killed, "the killed replica had no unfinished episode"
    continued = outcome.continued()
    print("RESUME-REPORT", outcome.figures(), flush=True)
    assert continued, "every episode of the killed replica was stored as it died"
    for (task_id, index), saved in outcome.last_of_killed.items():
        trajectory = continued.get(f"{task_id}/{index}")
        if trajectory is None:
            continue  # stored in the instant between its publish and its mark: not lost
        assert trajectory.resumed_turns == saved.num_turns >= 1, trajectory
        assert trajectory.num_turns > saved.num_turns
        ours, recorded = token_arrays(trajectory), token_arrays(saved)
        n = len(recorded.token_ids)
        assert trajectory.resumed_tokens == int(np.count_nonzero(recorded.versions >= 0))
        for name in ("token_ids", "logprobs", "loss_mask", "versions"):
            assert np.array_equal(getattr(ours, name)[:n], getattr(recorded, name)), name
    resumed = {tid for tid, t in outcome.stored.items() if t.resumed_turns}
    assert resumed == set(continued)


async def test_a_replica_told_to_leave_hands_on_every_episode_at_its_turn(tmp_path):
    outcome = await run_scenario(tmp_path, group_size=8, signum=signal.SIGTERM, grace_s=10.0)
    figures = outcome.figures()
    print("LEAVE-REPORT", figures, flush=True)
    assert outcome.last_of_killed, "the replica left with no unfinished episode"
    assert figures["tokens_regenerated"] == 0, figures
    # No turn was cut: every group it held went back from its episodes' turn boundaries.
    log = (tmp_path / "actor.log").read_text()
    assert re.search(r"leaving: [1-9]\d* groups handed back at .* 0 cut at the end", log), log[
        -3000:
    ]
    # Every one of its unfinished samples went on from its last turn, on the other replica.
    assert sorted(outcome.stored) == [f"resume/0/{i}" for i in range(8)]
    for (task_id, index), saved in outcome.last_of_killed.items():
        trajectory = outcome.stored[f"{task_id}/{index}"]
        assert trajectory.actor_id != outcome.killed
        assert trajectory.resumed_turns == saved.num_turns >= 1, trajectory
        assert trajectory.resumed_tokens == int(np.count_nonzero(token_arrays(saved).versions >= 0))
