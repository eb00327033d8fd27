"""An actor replica SIGKILLed mid-episode (docs/reliability.md), on real parts only
(bench/resume_support.py: a nats-server, the calculator env server with a slow tool, so an
episode spans seconds, `actor --replicas 2` with real vLLM engines on the shipped
warm-start model, which calls the `add` tool). The replica that recorded the first episode
checkpoint with a turn is killed. Its tasks come back after the ack wait; each of its
unfinished samples must continue on the other replica from its last recorded turn (counted
in the trajectory), and its trajectory must begin with exactly the tokens, logprobs, loss
mask and versions the dead replica generated. Nothing else is resumed."""

from __future__ import annotations

import numpy as np
import pytest

from bench.resume_support import run_scenario
from broker.codec import token_arrays

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
