"""The learner's books: every training prompt released and every trajectory taken off the
queue, counted exactly once. The ledger is also the checkpoint cursor: what a resumed run
must know to continue the count (`to_cursor` / `from_cursor`).

    released prompts = taken groups + groups still outstanding
    taken trajectories = trained + dropped (by reason) + filtered
    stored trajectories = trained + dropped + filtered + eval + malformed + still in the stream

Filtered trajectories are those of groups without reward signal that dynamic sampling set
aside (`learner.dynamic_sampling`): kept apart from the dropped ones, which something went
wrong with, although both earn their group a replacement.

A dropped group earns a replacement prompt (`num_dropped_groups`), so the dispatcher's
admission arithmetic (learner/dispatcher.py) can keep the learner fed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

FILTERED = "filtered"
"""The drop reason of a group set aside for no reward signal (learner/steps.py)."""


@dataclass
class Ledger:
    num_released: int = 0
    """Training prompts released (written ahead of their release, so never undercounted)."""
    num_taken_groups: int = 0
    """Groups taken off the queue: trained or dropped."""
    num_dropped_groups: int = 0
    """Groups dropped whole; each earns a replacement prompt."""
    num_trained: int = 0
    """Trajectories trained on."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Trajectories dropped, by reason (stale, future, errors, nonfinite, unused, and the
    sample problems of learner/steps.py: nonfinite_reward, nonfinite_logprobs, bad_tokens,
    bad_loss_mask)."""
    max_staleness_seen: int = 0
    """Largest staleness of a trained group (versions between its oldest token and the step)."""
    eval_results: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The eval record of every version evaluated."""
    num_eval_trajectories: int = 0
    """Eval trajectories acknowledged: those of recorded evals, and those of evals that a
    learner process released and did not live to record."""
    num_steps_without_loss_tokens: int = 0
    """Steps whose samples had no loss token (nothing learned; learner/loop.py warns)."""
    num_malformed: int = 0
    """Messages taken off the trajectory stream as bad input, or of another run
    (learner/intake.py)."""
    num_resumed_episodes: int = 0
    """Trajectories taken whose episode an actor continued from another's checkpoint (its
    replica died mid-episode; docs/reliability.md), with the turns and policy tokens taken
    over."""
    num_resumed_turns: int = 0
    num_resumed_tokens: int = 0

    def take_group(self, *, dropped_reason: str | None) -> None:
        """One group left the queue; `dropped_reason` None means it is (about to be) trained."""
        self.num_taken_groups += 1
        if dropped_reason is not None:
            self.num_dropped_groups += 1

    def count_resumed(self, trajectories) -> None:
        """Count the turns and tokens a group's trajectories took over from checkpoints."""
        for t in trajectories:
            self.num_resumed_episodes += t.resumed_turns > 0
            self.num_resumed_turns += t.resumed_turns
            self.num_resumed_tokens += t.resumed_tokens

    def drop(self, reason: str, num_trajectories: int) -> None:
        self.dropped[reason] += num_trajectories

    def train(self, num_trajectories: int, staleness: list[int], num_loss_tokens: int) -> bool:
        """Count a step's trajectories; False when it had no loss token (counted too)."""
        self.num_trained += num_trajectories
        self.max_staleness_seen = max([self.max_staleness_seen, *staleness])
        if num_loss_tokens == 0:
            self.num_steps_without_loss_tokens += 1
        return num_loss_tokens > 0

    @property
    def num_filtered(self) -> int:
        return self.dropped[FILTERED]

    @property
    def num_dropped(self) -> int:
        """Trajectories dropped for a problem (the filtered ones apart)."""
        return sum(self.dropped.values()) - self.num_filtered

    @property
    def num_outstanding_groups(self) -> int:
        return self.num_released - self.num_taken_groups

    def totals(self) -> dict[str, Any]:
        """The counts the run's final record reports."""
        return {
            "released_groups": self.num_released,
            "taken_groups": self.num_taken_groups,
            "outstanding_groups": self.num_outstanding_groups,
            "trained": self.num_trained,
            "dropped": self.num_dropped,
            "dropped_by_reason": {r: n for r, n in self.dropped.items() if r != FILTERED},
            "filtered": self.num_filtered,
            "max_staleness_seen": self.max_staleness_seen,
            "steps_without_loss_tokens": self.num_steps_without_loss_tokens,
            "eval_trajectories": self.num_eval_trajectories,
            "eval_pass_at_1": {str(v): r["pass_at_1"] for v, r in self.eval_results.items()},
            "resumed_episodes": self.num_resumed_episodes,
            "resumed_turns": self.num_resumed_turns,
            "resumed_tokens": self.num_resumed_tokens,
        }

    def to_cursor(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in _COUNTS},
            "dropped": dict(self.dropped),
            "eval_results": {str(v): r for v, r in self.eval_results.items()},
        }

    @classmethod
    def from_cursor(cls, cursor: dict[str, Any]) -> Ledger:
        return cls(
            **{name: cursor.get(name, 0) for name in _COUNTS},
            dropped=Counter(cursor.get("dropped", {})),
            eval_results={int(v): r for v, r in cursor.get("eval_results", {}).items()},
        )


_COUNTS = tuple(f.name for f in fields(Ledger) if f.default == 0)
"""The ledger's plain counts: saved in the cursor as they are, 0 when a cursor lacks one."""
