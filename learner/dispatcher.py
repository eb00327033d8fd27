"""The dispatcher: decides which prompts exist on the bus, and when (the tether).

Training prompts form an endless, deterministic stream: epoch e visits the dataset in a
permutation seeded by (seed, e); the i-th prompt released gets task id `<run id>-<i>`. With
online difficulty filtering (learner/difficulty.py) the stream may pass over saturated rows
of that order, so the i-th prompt is the i-th row visited and the stream keeps the row of
each prompt in flight, for the learner to record its group's outcome against. The run
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
from learner.difficulty import DifficultyFilter
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
    """The bound in force: what the next releases are admitted by and carry (it changes
    between steps under learner.max_staleness = "auto")."""
    seed: int = 0
    difficulty: DifficultyFilter | None = None
    """Online difficulty filtering; None visits every row of every epoch."""

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("the training dataset is empty")
        self._orders: dict[int, list[int]] = {}
        self.position = 0
        """With difficulty filtering: the next position of the dataset order to consider."""
        self.rows_in_flight: dict[int, int] = {}
        """With difficulty filtering: release index -> dataset row, until its group is taken."""

    def _row_at(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.rows))
        if epoch not in self._orders:
            self._orders = {epoch: dataset_order(len(self.rows), epoch, self.seed)}
        return self._orders[epoch][offset]

    def row_of(self, index: int) -> int:
        """The dataset row of the `index`-th prompt (new indices in increasing order)."""
        if self.difficulty is None:
            return self._row_at(index)
        if index not in self.rows_in_flight:
            position = self.position
            for _ in range(len(self.rows) - 1):  # past a whole epoch passed over, visit anyway
                if self.difficulty.visits(self._row_at(position), position):
                    break
                self.difficulty.num_skipped += 1
                position += 1
            self.position = position + 1
            self.rows_in_flight[index] = self._row_at(position)
        return self.rows_in_flight[index]

    def taken(self, task_id: str, rewards: list[float] | None) -> None:
        """The group of `task_id` left the queue: its outcome (`rewards`, None for a group
        dropped for a problem) counts against its row."""
        if self.difficulty is None:
            return
        row = self.rows_in_flight.pop(int(task_id.rsplit("-", 1)[1]), None)
        if row is not None and rewards is not None:
            self.difficulty.observe(row, rewards)

    def report(self) -> dict:
        """A train record's fields: prompts passed over so far, and per data source the
        share of rows seen that are saturated (empty without filtering)."""
        if self.difficulty is None:
            return {}
        shares = self.difficulty.saturated_share(self.rows)
        return {"prompts_skipped": self.difficulty.num_skipped} | {
            f"difficulty/saturated/{source}": share for source, share in shares.items()
        }

    def state(self) -> dict | None:
        """What a checkpoint and the write-ahead keep of the stream (None without filtering)."""
        if self.difficulty is None:
            return None
        rows = {str(i): row for i, row in self.rows_in_flight.items()}
        return {"position": self.position, "rows_in_flight": rows, **self.difficulty.state()}

    def restore(self, checkpoint: dict | None, write_ahead: dict | None, checkpointed: int):
        """Resume from the checkpoint's state, then the write-ahead's releases past its
        `checkpointed` count (a write-ahead no newer than the checkpoint changes nothing)."""
        if self.difficulty is None:
            return
        if checkpoint:
            self.position = checkpoint["position"]
            self.rows_in_flight = _rows_in_flight(checkpoint, since=0)
            self.difficulty.restore(checkpoint)
        if write_ahead:
            self.position = max(self.position, write_ahead["position"])
            self.rows_in_flight |= _rows_in_flight(write_ahead, since=checkpointed)

    def task(self, index: int, *, version: int) -> PromptTask:
        row = self.rows[self.row_of(index)]
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
            max_staleness=self.max_staleness,
            group_size=self.group_size,
        )


def _rows_in_flight(state: dict, *, since: int) -> dict[int, int]:
    """A saved stream state's release index -> row, of the indices from `since` on."""
    rows = {int(i): row for i, row in state["rows_in_flight"].items()}
    return {i: row for i, row in rows.items() if i >= since}


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
    row: dict,
    *,
    task_id: str,
    step: int,
    min_version: int,
    group_size: int,
    max_staleness: int = -1,
    is_eval: bool = False,
) -> PromptTask:
    return PromptTask(
        task_id=task_id,
        step=step,
        min_version=min_version,
        max_staleness=max_staleness,
        group_size=group_size,
        env_class=row["env_class"],
        data_source=row.get("data_source", ""),
        prompt=row["prompt"],
        reward_spec=row.get("reward_spec", {}),
        extra_info=row.get("extra_info", {}),
        is_eval=is_eval,
    )
