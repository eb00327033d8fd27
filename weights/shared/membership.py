"""Who is in the weight broadcast's group, decided round by round (pure).

A group (one communicator, weights/shared/communicator.py) lives as long as its membership: the
sender keeps it while exactly the same members are alive and its last round went through,
and forms a new one (a new group id, every alive member seated again) when a member
registered, left or was evicted, or a round failed. So a new or restarted engine joins at
the next version, and a dead one costs one regrouping.

    next_roster(current, alive, broken)     the group round v is planned on
    without(roster, absent, next_id)        the group it is sent on when some never got ready
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Roster:
    """One group: who sits at which ranks."""

    group_id: int
    slots: dict[int, int]
    """{member id: engine workers it brings (ranks it takes)}."""
    backend: str

    @property
    def ranks(self) -> dict[int, int]:
        """{member id: first rank}: the sender is rank 0, members follow in id order."""
        ranks, next_rank = {}, 1
        for member_id in sorted(self.slots):
            ranks[member_id] = next_rank
            next_rank += self.slots[member_id]
        return ranks

    @property
    def world_size(self) -> int:
        return 1 + sum(self.slots.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "backend": self.backend,
            "world_size": self.world_size,
            "slots": {str(k): v for k, v in self.slots.items()},
            "ranks": {str(k): v for k, v in self.ranks.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Roster:
        slots = {int(k): int(v) for k, v in data["slots"].items()}
        return cls(group_id=int(data["group_id"]), slots=slots, backend=data["backend"])


def next_roster(
    current: Roster | None, alive: dict[int, int], *, broken: bool, next_id: int, backend: str
) -> Roster | None:
    """The group of the next round: `current` while its members are exactly the `alive`
    ones ({member id: slots}) and it is not `broken`; else a new group (id `next_id`) of
    every alive member; None when nobody is alive."""
    for member_id, slots in alive.items():
        if slots < 1:
            raise ValueError(f"member {member_id} asks for {slots} slots")
    if not alive:
        return None
    if current is not None and not broken and current.slots == alive:
        return current
    return Roster(group_id=next_id, slots=dict(alive), backend=backend)


def without(roster: Roster, absent: set[int], *, next_id: int) -> Roster | None:
    """`roster` less the `absent` members, as a new group (None when nobody is left)."""
    slots = {m: s for m, s in roster.slots.items() if m not in absent}
    return Roster(next_id, slots, roster.backend) if slots else None
