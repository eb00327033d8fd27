"""weights/actor_side/follower.py on fakes: a failed round is not joined again (its roster still
seats
the member, but the sender gave up on it: joining it again paused generation for one
transfer timeout after another while the learner waited for data, a 3-minute stall seen in
the fault suite when a peer replica died during a round)."""

from __future__ import annotations

from weights.actor_side.follower import WeightUpdate, WeightUpdateError, follow_weights
from weights.shared.protocol import RoundTicket


def _ticket(version: int, store_id: str = "a") -> RoundTicket:
    return RoundTicket(
        version=version,
        group_id=0,
        member_id=1,
        slots=1,
        store_host="127.0.0.1",
        store_port=1,
        join_timeout_s=1.0,
        transfer_timeout_s=1.0,
        store_id=store_id,
    )


class _Subscription:
    """Seats us in every announced round newer than `after_version` (round 3 stays
    announced until round 4 comes, as when the learner waits for our trajectories)."""

    store_id = "a"

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.left = False

    def wait_round(self, after_version: int, timeout_s: float, failed=None) -> RoundTicket | None:
        if failed is not None and failed.store_id == self.store_id:
            after_version = max(after_version, failed.version)  # as the real one does
        self.asked.append(after_version)
        if len(self.asked) > 5:
            self.left = True  # enough: the test has seen what it needs
            return None
        latest = 3 if len(self.asked) < 3 else 4
        return _ticket(latest) if latest > after_version else None


class _Engine:
    num_weight_slots = 1

    def __init__(self) -> None:
        self.version = 2
        self.rounds: list[int] = []

    fail_store = "a"  # round 3 of this store fails

    async def update_weights(self, ticket: RoundTicket) -> WeightUpdate:
        self.rounds.append(ticket.version)
        if ticket.version == 3 and ticket.store_id == self.fail_store:
            raise WeightUpdateError("wait timeout after 20000ms: a peer never formed the group")
        self.version = ticket.version
        return WeightUpdate(ticket.version, 0.0, 0.0, 0.0, 0.0, 0)


async def test_a_failed_round_is_not_joined_again():
    engine, subscription, updates = _Engine(), _Subscription(), []
    await follow_weights(engine, subscription, poll_s=0.01, on_update=updates.append)
    assert engine.rounds == [3, 4]  # round 3 once, then the next one
    assert subscription.asked[:3] == [2, 3, 3]  # after the failure: only rounds after 3
    assert [u.version for u in updates] == [4] and engine.version == 4


class _RestartedSubscription(_Subscription):
    """Round 3 of store "a" fails (its learner dies); the learner comes back as store "b",
    resumed at version 2, and its own round 3 follows."""

    def wait_round(self, after_version: int, timeout_s: float, failed=None) -> RoundTicket | None:
        if len(self.asked) >= 1:
            self.store_id = "b"  # registered with the restarted learner's store
        if failed is not None and failed.store_id == self.store_id:
            after_version = max(after_version, failed.version)
        self.asked.append(after_version)
        if len(self.asked) == 1:
            return _ticket(3, "a")
        if len(self.asked) > 3:
            self.left = True
            return None
        return _ticket(3, "b") if after_version < 3 else None


async def test_a_failed_round_of_a_dead_learner_does_not_hide_its_successors_round():
    engine, subscription = _Engine(), _RestartedSubscription()
    await follow_weights(engine, subscription, poll_s=0.01)
    assert subscription.asked[:2] == [2, 2]  # after the failure: round 3 of store "b" too
    assert engine.rounds == [3, 3] and engine.version == 3


async def test_a_failed_round_is_reported_before_the_next_wait():
    engine, subscription, failures = _Engine(), _Subscription(), []

    async def on_failure(error: WeightUpdateError) -> None:
        failures.append((str(error), len(subscription.asked)))

    await follow_weights(engine, subscription, poll_s=0.01, on_failure=on_failure)
    assert failures == [("wait timeout after 20000ms: a peer never formed the group", 1)]
    assert engine.rounds == [3, 4]
