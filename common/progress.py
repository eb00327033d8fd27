"""The progress line: one line per learner training step and one per eval, made from the
learner's `metrics.jsonl` records (fields in docs/learner.md). One home for both places
that show it: the learner itself when started by hand on a terminal (learner/reporting.py,
`learner.progress`), and the launcher while it runs the roles (`make run`, deploy/local.py).
Pure formatting; the caller prints.
"""

from __future__ import annotations

from typing import Literal, TextIO

ProgressSetting = Literal["auto", "always", "never"]


def shows_progress(setting: ProgressSetting, stream: TextIO) -> bool:
    """Whether to print progress lines on `stream`: "auto" on a terminal only (a log file,
    or the pipe a launcher reads, gets none: the launcher shows them itself)."""
    if setting == "auto":
        return stream.isatty()
    return setting == "always"


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def progress_line(
    record: dict, *, total_steps: int, last_eval: dict | None, first: dict | None = None
) -> str:
    """One line per training step: step, version, reward, eval, staleness, speed, time left.
    Time left extrapolates the pace since the `first` training record (start-up and the
    first eval are not part of it); it shows "--" until there is a pace to go by."""
    step, wall = record["version"], record["wall_s"]  # steps taken = the policy version
    if first is not None and step > first["version"]:
        pace = (wall - first["wall_s"]) / (step - first["version"])
        left = fmt_duration(pace * (total_steps - step))
    else:
        left = "--:--"
    eval_text = (
        f"eval pass@1 {last_eval['pass_at_1']:.2f} (v{last_eval['version']})"
        if last_eval
        else "eval pass@1 --"
    )
    return (
        f"step {step:>3}/{total_steps} | v {record['version']:>3} | "
        f"reward {record['reward_mean']:.2f}{_filtered(record)} | {eval_text} | "
        f"staleness max {record['max_staleness_seen']}{_bound(record)} | "
        f"{record['tokens_per_s']:,.0f} tok/s{_sharing(record)} | "
        f"{fmt_duration(wall)} elapsed, ~{left} left"
    )


def _bound(record: dict) -> str:
    """The bound in force for this step (it moves under learner.max_staleness = "auto")."""
    return f" of {record['max_staleness']}" if "max_staleness" in record else ""


def _filtered(record: dict) -> str:
    """Groups this step filtered for no reward signal (learner.dynamic_sampling): they were
    replaced, so the reward shown is that of groups with signal."""
    filtered = record.get("filtered_groups", 0)
    return f" (filtered {filtered})" if filtered else ""


def _sharing(record: dict) -> str:
    """How much shared-prefix training saved in this step (nothing when it shared nothing)."""
    ratio = record.get("train/prefix_sharing_ratio", 1.0)
    return f" (shared prefixes x{ratio:.1f})" if ratio > 1.005 else ""


def eval_line(record: dict) -> str:
    return (
        f"  eval at v{record['version']}: pass@1 {record['pass_at_1']:.3f} over "
        f"{record['num_prompts']} prompts x {record['samples_per_prompt']} samples"
    )


class ProgressView:
    """The lines a stream of records shows, in order: `lines(record)` gives the record's
    line (none for a `done` or `skip` record, nor for a record shown already: a learner
    restarted from a checkpoint writes the steps since it again). Remembers the newest eval
    and the first training step, which the line reports and paces time left by."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.last_eval: dict | None = None
        self.first_train: dict | None = None
        self._shown: set[tuple[str, int | None]] = set()

    def lines(self, record: dict) -> list[str]:
        shown = (record["kind"], record.get("version"))
        if shown in self._shown:
            return []
        self._shown.add(shown)
        if record["kind"] == "eval":
            self.last_eval = record
            return [eval_line(record)]
        if record["kind"] == "train":
            self.first_train = self.first_train or record
            line = progress_line(
                record,
                total_steps=self.total_steps,
                last_eval=self.last_eval,
                first=self.first_train,
            )
            return [line]
        return []

    def learner_restarted(self) -> None:
        """A restarted learner's clock (`wall_s`) starts again: pace time left from its own
        first new step. Lines shown already stay shown."""
        self.first_train = None
