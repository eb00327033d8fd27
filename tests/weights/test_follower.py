"""weights/follower.py on fakes: a failed round is not joined again (its roster still seats
the member, but the sender gave up on it: joining it again paused generation for one
transfer timeout after another while the learner waited for data, a 3-minute stall seen in
the fault suite when a peer replica died during a round)."""

from __future__ import annotations

from weights.follower import WeightUpdate, WeightUpdateError, follow_weights
from weights.subscription import RoundTicket


def _ticket(version: int) -> RoundTicket:
    return RoundTicket(
        version=version,
        group_id=0,
        member_id=1,
        slots=1,
        store_host="127.0.0.1",
        store_port=1,
        join_timeout_s=1.0,
        transfer_timeout_s=1.0,
    )


class _Subscription:
    """Seats us in every announced round newer than `after_version` (round 3 stays
    announced until round 4 comes, as when the learner waits for our trajectories)."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.left = False

    def wait_round(self, after_version: int, timeout_s: float) -> RoundTicket | None:
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

    async def update_weights(self, ticket: RoundTicket) -> WeightUpdate:
        self.rounds.append(ticket.version)
        if ticket.version == 3:
            raise WeightUpdateError("wait timeout after 20000ms: a peer never formed the group")
        self.version = ticket.version
        return WeightUpdate(ticket.version, 0.0, 0.0, 0.0, 0.0, 0)


async def test_a_failed_round_is_not_joined_again():
    engine, subscription, updates = _Engine(), _Subscription(), []
    await follow_weights(engine, subscription, poll_s=0.01, on_update=updates.append)
    assert engine.rounds == [3, 4]  # round 3 once, then the next one
    assert subscription.asked[:3] == [2, 3, 3]  # after the failure: only rounds after 3
    assert [u.version for u in updates] == [4] and engine.version == 4
