"""What a user sees of a run: the learner's records and the supervisors' events followed as
they are written (`RunFollower`, for `make run` and for a run on Ray alike), and at the end
a summary table, `summary.json` and `progress.png`. Pure functions over the learner's
`metrics.jsonl` records (see docs/running.md and docs/learner.md for their fields), plus the
plot. The progress line itself lives in common/progress.py: the learner prints the same
line when started by hand; an event's line lives in common/supervision.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.progress import ProgressView, fmt_duration
from common.supervision import EVENTS_FILE, event_line


class RecordTail:
    """Follows `metrics.jsonl` while the learner writes it. A resumed learner cuts the file
    back to its checkpoint (a new file, os.replace): `poll()` then starts over and says so."""

    def __init__(self, path: Path, *, from_end: bool = False) -> None:
        """`from_end`: only what is written from now on (not an earlier run's lines)."""
        self.path = path
        stat = path.stat() if from_end and path.exists() else None
        self.offset = stat.st_size if stat else 0
        self.inode: int | None = stat.st_ino if stat else None

    def poll(self) -> tuple[list[dict], bool]:
        """(records new since the last poll, whether the file was cut back: the records are
        then the whole file again)."""
        try:
            with open(self.path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                cut_back = self.inode is not None and inode != self.inode
                if cut_back:
                    self.offset = 0
                self.inode = inode
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return [], False
        end = data.rfind(b"\n") + 1
        records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        self.offset += end
        return records, cut_back


class RunFollower:
    """Follows a run directory: `poll()` gives the lines to show since the last poll, one per
    new training step or eval (common/progress.py) and one per supervision event (a restart,
    a give-up); `records` is the learner's history so far, `done` whether it wrote its end."""

    def __init__(self, run_dir: Path, total_steps: int) -> None:
        self.metrics = RecordTail(run_dir / "metrics.jsonl")
        self.events = RecordTail(run_dir / EVENTS_FILE, from_end=True)  # a resumed run's own
        self.view = ProgressView(total_steps)
        self.records: list[dict] = []
        self.done = False

    def poll(self) -> list[str]:
        new, cut_back = self.metrics.poll()
        if cut_back:  # a resumed learner rewrote its history from the checkpoint
            self.records.clear()
            self.view.learner_restarted()
        self.records.extend(new)
        self.done = self.done or any(r["kind"] == "done" for r in new)
        lines = [line for record in new for line in self.view.lines(record)]
        events, _ = self.events.poll()
        return lines + [line for event in events if (line := event_line(event))]


def summarize(records: list[dict]) -> dict:
    """The run's summary: eval pass@1 at start and end, counts, staleness, wall time."""
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    done = next((r for r in records if r["kind"] == "done"), {})
    if not train or not evals:
        raise ValueError("the run produced no training step or no eval: nothing to summarize")
    last = train[-1]
    return {
        "eval_pass1_start": evals[0]["pass_at_1"],
        "eval_pass1_end": evals[-1]["pass_at_1"],
        "eval_pass1_gain": evals[-1]["pass_at_1"] - evals[0]["pass_at_1"],
        "steps": last["version"],
        "final_version": last["version"],
        "wall_s": done.get("wall_s", last["wall_s"]),
        "max_staleness_seen": max(r["max_staleness_seen"] for r in train),
        "published": done.get("published", done.get("stream_messages_stored")),
        "trained": done.get("trained", last["trained"]),
        "dropped": done.get("dropped", last["dropped"]),
        "dropped_by_reason": done.get("dropped_by_reason", {}),
        "filtered": done.get("filtered", 0),
        "reward_mean_first": train[0]["reward_mean"],
        "reward_mean_last": last["reward_mean"],
        "tokens_per_s_mean": sum(r["tokens_per_s"] for r in train) / len(train),
        "prefix_sharing_ratio_mean": sum(r.get("train/prefix_sharing_ratio", 1.0) for r in train)
        / len(train),
    }


def summary_table(summary: dict) -> str:
    rows = [
        ("eval pass@1 at start", f"{summary['eval_pass1_start']:.3f}"),
        ("eval pass@1 at end", f"{summary['eval_pass1_end']:.3f}"),
        ("steps (policy versions)", f"{summary['steps']}"),
        ("wall time", fmt_duration(summary["wall_s"])),
        ("trajectories published", f"{summary['published']}"),
        ("  trained on", f"{summary['trained']}"),
        ("  dropped", f"{summary['dropped']} {summary['dropped_by_reason'] or ''}".strip()),
        ("  filtered", f"{summary['filtered']}"),
        ("max staleness seen", f"{summary['max_staleness_seen']}"),
        ("mean tokens/s (learner)", f"{summary['tokens_per_s_mean']:,.0f}"),
        ("mean prefix sharing", f"x{summary['prefix_sharing_ratio_mean']:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def plot(records: list[dict], path: Path) -> Path:
    """Reward and eval pass@1 against step and against wall time, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x_key, label in (
        (axes[0], "version", "step (policy version)"),
        (axes[1], "wall_s", "wall time (s)"),
    ):
        ax.plot(
            [r[x_key] for r in train],
            [r["reward_mean"] for r in train],
            label="train reward (mean)",
            color="tab:blue",
            alpha=0.7,
        )
        eval_x = [r[x_key] for r in evals]
        ax.plot(eval_x, [r["pass_at_1"] for r in evals], "o-", label="eval pass@1", color="tab:red")
        ax.set_xlabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward / pass@1")
    axes[0].legend(loc="lower right")
    fig.suptitle("Tether: calculator agent, asynchronous GRPO")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def finish(run_dir: Path, records: list[dict], say=print) -> None:
    """The end of a run that finished: `summary.json` and `progress.png` in `run_dir`, and
    the summary table said (printed, or `say`) with where both files are."""
    summary = summarize(records)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_path = plot(records, run_dir / "progress.png")
    say("\n" + summary_table(summary))
    say(f"\nsummary: {run_dir / 'summary.json'}\nplot:    {plot_path}")
