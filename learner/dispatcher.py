"""The dispatcher: decides which prompts exist on the bus, and when (the tether).

Training prompts form an endless, deterministic stream: epoch e visits the dataset in a
permutation seeded by (seed, e); the i-th prompt released gets task id `<run id>-<i>`. The run
id is new for every run (`new_run_id`) and kept by the run's write-ahead and checkpoints
(learner/releases.py), so a resumed learner re-releases the same ids and JetStream's
deduplication stores them once, while a new run on the same bus never collides with an
earlier one's ids (which the duplicate window would silently drop).

Admission (the rule itself: `learner/staleness.py`): the prompts meant for step s are
released only once the policy version v >= s - max_staleness. With P prompts per step that
allows (v + max_staleness + 1) * P releases (never past the run's last step), plus one
replacement for every group the learner dropped (otherwise drops would starve the
learner). Each task carries `min_version = step - max_staleness`, the oldest weights allowed
to generate it, so max_staleness = 0 is the synchronous baseline.
"""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import dataclass

from broker.wire import PromptTask
from learner.staleness import oldest_allowed_version, release_horizon


def num_releasable(
    *,
    version: int,
    num_released: int,
    num_dropped_groups: int,
    prompts_per_step: int,
    max_staleness: int,
    total_steps: int | None = None,
) -> int:
    """How many more training prompts may be released at policy version `version`; with
    `total_steps`, none meant for a step past the run's last (steps 0 .. total_steps - 1)."""
    horizon = release_horizon(version, max_staleness)
    if total_steps is not None:
        horizon = min(horizon, total_steps)
    allowed = horizon * prompts_per_step + num_dropped_groups
    return max(0, allowed - num_released)


def step_of_release(index: int, *, version: int, prompts_per_step: int, max_staleness: int) -> int:
    """The training step the `index`-th released prompt is meant for.

    Normally index // P; replacements for dropped groups run past the admitted horizon and
    are clamped to the newest admitted step, v + max_staleness.
    """
    return min(index // prompts_per_step, release_horizon(version, max_staleness) - 1)


def new_run_id(namespace: str) -> str:
    """The id of a run that starts anew: its namespace and 32 random bits."""
    return f"{namespace}-{secrets.token_hex(4)}"


def run_of(task_id: str) -> str:
    """The run id in a task id (`<run id>-<index>` or `<run id>-eval<version>-<index>`)."""
    return re.sub(r"-(eval\d+-)?\d+$", "", task_id)


def dataset_order(num_rows: int, epoch: int, seed: int) -> list[int]:
    order = list(range(num_rows))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


@dataclass
class PromptStream:
    """Turns dataset rows into PromptTasks in release order (pure, no I/O)."""

    rows: list[dict]
    run_id: str
    group_size: int
    prompts_per_step: int
    max_staleness: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("the training dataset is empty")
        self._orders: dict[int, list[int]] = {}

    def task(self, index: int, *, version: int) -> PromptTask:
        epoch, position = divmod(index, len(self.rows))
        if epoch not in self._orders:
            self._orders = {epoch: dataset_order(len(self.rows), epoch, self.seed)}
        row = self.rows[self._orders[epoch][position]]
        step = step_of_release(
            index,
            version=version,
            prompts_per_step=self.prompts_per_step,
            max_staleness=self.max_staleness,
        )
        return task_from_row(
            row,
            task_id=f"{self.run_id}-{index}",
            step=step,
            min_version=oldest_allowed_version(step, self.max_staleness),
            group_size=self.group_size,
        )


def eval_tasks(
    rows: list[dict], *, run_id: str, version: int, samples_per_prompt: int
) -> list[PromptTask]:
    """The eval set at one policy version: every row, generated with exactly that version."""
    return [
        task_from_row(
            row,
            task_id=f"{run_id}-eval{version}-{i}",
            step=version,
            min_version=version,
            group_size=samples_per_prompt,
            is_eval=True,
        )
        for i, row in enumerate(rows)
    ]


def task_from_row(
    row: dict, *, task_id: str, step: int, min_version: int, group_size: int, is_eval=False
) -> PromptTask:
    return PromptTask(
        task_id=task_id,
        step=step,
        min_version=min_version,
        group_size=group_size,
        env_class=row["env_class"],
        data_source=row.get("data_source", ""),
        prompt=row["prompt"],
        reward_spec=row.get("reward_spec", {}),
        extra_info=row.get("extra_info", {}),
        is_eval=is_eval,
    )
