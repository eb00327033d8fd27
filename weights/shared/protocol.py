"""The contract between an actor and its engine's workers: what the actor's subscription
hands the workers for a round (`RoundTicket`, weights/actor_side/subscription.py makes it),
which the workers (weights/engine_side/) take part in the round with. Both sides import it;
it imports neither vLLM nor the learner's side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RoundTicket:
    """A member's seat in round `version`: what its engine workers need to take part."""

    version: int
    group_id: int
    """The group the round is planned on (the sender may move it to a smaller one)."""
    member_id: int
    slots: int
    store_host: str
    store_port: int
    join_timeout_s: float
    transfer_timeout_s: float
    store_id: str = ""
    """The store (learner process) that planned the round: a receiver never takes part in
    it on another store, such as a restarted learner's on the same address."""
    payload: str = "full"
    """What the round carries: `full` weights, or a `lora` adapter (weights/formats/adapter.py)."""
    adapter_config: dict[str, Any] | None = None
    """The adapter's PEFT `adapter_config.json` (payload `lora`)."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
