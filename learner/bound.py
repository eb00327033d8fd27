"""The staleness bound a run trains under, step by step: the config's fixed number, or
(`learner.max_staleness = "auto"`) an `AdaptiveBound` (learner/staleness.py) moved after
every step from the step's data wait, train time, PPO health and the share of its episodes'
time spent in tools.

An "auto" bound also switches the off-policy correction: above 1 the behaviour policy may
be several updates old, and each step trains with the configured correction (the proximal
anchor and an importance weight; proximal + TIS when none is configured, as
docs/running.md measured it); at 1 and below, plain PPO against the behaviour logprobs,
which spares the proximal recomputation's forward pass. A fixed bound leaves the configured
algorithm alone. GSPO has no such correction: its algorithm is never changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from learner.env_metrics import time_in_tools
from learner.staleness import AdaptiveBound

if TYPE_CHECKING:
    from learner.batching import Group
    from learner.config import LearnerConfig
    from learner.trainer.config import AlgorithmConfig

CORRECTION = {"ratio_anchor": "proximal", "importance_weight": "tis"}
"""The correction an "auto" bound above 1 turns on when the config names none."""
NO_CORRECTION = {"ratio_anchor": "behaviour", "importance_weight": "none"}


def algorithm_for(configured: AlgorithmConfig, bound: int) -> AlgorithmConfig:
    """The algorithm of a step trained under an adaptive `bound`."""
    if configured.policy_loss != "ppo":
        return configured
    if bound > 1:
        return configured if configured.needs_proximal else configured.model_copy(update=CORRECTION)
    return configured.model_copy(update=NO_CORRECTION)


class StalenessBound:
    """The bound in force (`current`); `state` goes into the checkpoint's cursor and comes
    back as `state` here on a resume."""

    def __init__(self, config: LearnerConfig, state: dict | None = None) -> None:
        self.configured = config.algorithm
        self.first_step = True
        self.controller: AdaptiveBound | None = None
        self.fixed = 0
        if config.adaptive_staleness:
            ceiling, limits = config.max_staleness_limit, config.max_staleness_auto
            self.controller = (
                AdaptiveBound.from_state(state, ceiling, limits)
                if state
                else AdaptiveBound(ceiling, limits)
            )
        else:
            self.fixed = int(config.max_staleness)

    @property
    def current(self) -> int:
        return self.controller.bound if self.controller is not None else self.fixed

    def algorithm(self) -> AlgorithmConfig | None:
        """The algorithm of the next step; None: the configured one, unchanged."""
        if self.controller is None:
            return None
        return algorithm_for(self.configured, self.controller.bound)

    def after_step(
        self, wait_s: float, train_s: float, metrics: dict[str, float], groups: Iterable[Group] = ()
    ) -> int:
        """The bound for the next step, after one that waited `wait_s` for its data, trained
        for `train_s` on `groups` and reported `metrics` (its PPO health among them). The
        first step of a learner process is no sign of slow tools: it waited for the engines
        to start (or, resumed, for the actors to catch up)."""
        first, self.first_step = self.first_step, False
        if self.controller is not None and not first:
            episodes = [t for g in groups for t in g.trajectories]
            self.controller.observe(wait_s=wait_s, train_s=train_s, health=metrics,
                                    tool_fraction=time_in_tools(episodes))  # fmt: skip
        return self.current

    def state(self) -> dict | None:
        return self.controller.state() if self.controller is not None else None
