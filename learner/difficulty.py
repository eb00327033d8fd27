"""Online difficulty filtering (`learner.difficulty`, off by default): prompts whose recent
groups carried no reward signal (all solved, or all failed) are visited less often.

A dataset row is *saturated* once its last `window` groups each got one reward for every
sample. When the prompt stream (learner/dispatcher.py) reaches a saturated row it visits it
with probability `keep`, else passes to the next row of the dataset order; every other row
is visited as before. The coin is a pure function of (seed, stream position), so the same
seed and the same outcomes give the same prompts. A saturated row comes back into play as
soon as one of its groups has signal again (visited at `keep`, it still gets groups).

Where dynamic sampling (`learner.dynamic_sampling`) throws away groups without signal after
generating them, this skips most of their generation: the two compose. Outcomes are counted
per row and reported per data source (the share of each source's seen rows now saturated).

The state (recent outcomes, the stream's position, the rows of prompts in flight) is saved
in the checkpoint cursor and the dispatcher's write-ahead (learner/releases.py), so a
resumed learner releases the prompts its lost run released, and observes each group's
outcome once: outcomes after the checkpoint are observed again when their groups come back.
Pure: no I/O.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pydantic

from common.config import StrictModel


class DifficultyConfig(StrictModel):
    enabled: bool = False
    """Visit saturated prompts less often (the one switch)."""
    window: int = pydantic.Field(default=2, ge=1)
    """A row is saturated after this many groups in a row without reward signal."""
    keep: float = pydantic.Field(default=0.25, gt=0.0, le=1.0)
    """Probability of visiting a saturated row when the stream reaches it."""


def has_signal(rewards: list[float]) -> bool:
    """A group teaches something only if its rewards differ (group-relative advantages)."""
    return len(set(rewards)) > 1


@dataclass
class DifficultyFilter:
    config: DifficultyConfig
    seed: int = 0
    recent: dict[int, list[bool]] = field(default_factory=dict)
    """Row -> whether each of its last `window` groups had signal, oldest first."""
    num_skipped: int = 0
    """Stream positions passed over (a saturated row not visited)."""

    def observe(self, row: int, rewards: list[float]) -> None:
        history = self.recent.setdefault(row, [])
        history.append(has_signal(rewards))
        del history[: -self.config.window]

    def saturated(self, row: int) -> bool:
        history = self.recent.get(row, [])
        return len(history) == self.config.window and not any(history)

    def visits(self, row: int, position: int) -> bool:
        """Whether the stream, at `position`, visits `row`."""
        if not self.saturated(row):
            return True
        return random.Random(f"{self.seed}:difficulty:{position}").random() < self.config.keep

    def saturated_share(self, rows: list[dict]) -> dict[str, float]:
        """Per data source, the share of its rows with outcomes that are saturated now."""
        seen: Counter[str] = Counter()
        saturated: Counter[str] = Counter()
        for row in self.recent:
            source = rows[row].get("data_source", "") or "unknown"
            seen[source] += 1
            saturated[source] += self.saturated(row)
        return {source: saturated[source] / seen[source] for source in sorted(seen)}

    def state(self) -> dict:
        return {
            "recent": {str(row): flags for row, flags in self.recent.items()},
            "num_skipped": self.num_skipped,
        }

    def restore(self, state: dict) -> None:
        self.recent = {int(row): list(flags) for row, flags in state.get("recent", {}).items()}
        self.num_skipped = state.get("num_skipped", 0)
