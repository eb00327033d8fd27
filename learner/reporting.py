"""What the learner loop reports, in one place.

- `metrics.jsonl` (and W&B, `learner/sinks.py`): one record per training step, per eval, and
  a final `done` record; Prometheus (`learner/metrics.py`) is updated from the same records.
- `trained.jsonl`: one line per training step, `{"step", "version", "trajectory_ids",
  "group_ids"}`: step s is the update from version s to s + 1, trained on exactly these
  trajectories, of these groups (prompt task ids).
- `dropped.jsonl`: one line per dropped group (or the error samples removed from a trained
  group): `{"version", "group_id", "reason", "whole_group", "trajectory_ids"}`, `version`
  being the learner's version when it decided; `whole_group` says whether the group left
  with it (any reason can take a whole group: one with under two valid samples is dropped
  for its most common problem, `errors` included).
- `evals/global_step_<v>/`: the eval trajectories and their aggregate (`learner/eval_dump.py`).
- stdout, when `learner.progress` says so (by default on a terminal): the progress line of
  each step and eval record, the one `make run` shows (common/progress.py).

Together, trained.jsonl and dropped.jsonl are the run's exact history: every training
trajectory the learner consumed appears in one of them, once. The line counts of the three
JSONL files go into each checkpoint (`position()`); on resume the files are cut back to
them, so what a crash undid disappears from the history and is written again when redone.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from common.progress import ProgressView, shows_progress
from learner.batching import Group
from learner.config import LearnerConfig
from learner.env_metrics import rollout_metrics
from learner.eval_dump import write_aggregated_results, write_eval_dump
from learner.metrics import record_step
from learner.sinks import DONE_FILE, METRICS_FILE, MetricsSink
from learner.staleness import oldest_version, version_span

TRAINED_FILE = "trained.jsonl"
DROPPED_FILE = "dropped.jsonl"


def truncate_lines(path: Path, num_lines: int) -> None:
    """Keep the first `num_lines` lines of `path` (atomically); a missing file stays so."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) <= num_lines and all(line.endswith("\n") for line in lines):
        return
    tmp = path.with_name(path.name + ".tmp")
    kept = [line if line.endswith("\n") else line + "\n" for line in lines[:num_lines]]
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


class _JsonLines:
    """An append-only JSONL file that counts its lines."""

    def __init__(self, path: Path, num_lines: int) -> None:
        truncate_lines(path, num_lines)
        self.num_lines = num_lines
        self._file = open(path, "a", encoding="utf-8")  # closed in close()

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self.num_lines += 1

    def close(self) -> None:
        self._file.close()


def train_record(
    *,
    step: int,
    version: int,
    groups: list[Group],
    samples: list,
    staleness: list[int],
    metrics: dict,
    seconds: dict[str, float],
    ledger,
    num_receivers: int,
    num_bytes: int,
    held_unacked: int,
) -> dict:
    """The `train` record of one step in metrics.jsonl: what it trained on, how long each
    phase took (`seconds`: wall_s, wait_data_s, train_s, broadcast_s), the ledger's running
    counts, and the trainer's own metrics under `train/`. `num_bytes`: the weight update's
    bytes (with LoRA, the adapter's)."""
    num_tokens = sum(s.num_tokens for s in samples)
    return {
        "kind": "train",
        "step": step,
        "version": version,
        **seconds,
        # Per episode (an agent episode of several conversations is several samples).
        "reward_mean": sum(sum(g.rewards) for g in groups) / sum(len(g.rewards) for g in groups),
        "staleness": staleness,
        "staleness_max_batch": max(staleness),
        "max_staleness_seen": ledger.max_staleness_seen,
        "tokens_per_s": num_tokens / max(seconds["train_s"], 1e-9),
        "num_tokens": num_tokens,
        "broadcast_receivers": num_receivers,
        "broadcast_bytes": num_bytes,
        "released": ledger.num_released,
        "trained": ledger.num_trained,
        "dropped": ledger.num_dropped,
        "dropped_by_reason": dict(ledger.dropped),
        "held_unacked": held_unacked,
        **{f"train/{k}": v for k, v in metrics.items()},
    }


def staleness_fields(groups: list[Group], masked: int, metrics: dict) -> dict:
    """A step record's staleness fields beyond the histogram: each trained episode's version
    span, and the loss tokens the `token` rule cleared (learner.staleness_rule)."""
    trained = int(metrics["num_loss_tokens"])
    return {
        "version_span": [version_span(a.versions) for g in groups for a in g.tokens],
        "stale_tokens_masked": masked,
        "stale_token_fraction": masked / (masked + trained) if masked + trained else 0.0,
    }


def done_record(
    *,
    run_id: str,
    lineage: str,
    wall_s: float,
    version: int,
    ledger,
    intake,
    malformed: int,
    stream_state,
) -> dict:
    """The run's closing record: the books, and what the trajectory stream still holds."""
    return {
        "kind": "done",
        "run_id": run_id,
        "lineage": lineage,
        "wall_s": wall_s,
        "version": version,
        **ledger.totals(),
        "invalid": intake.num_invalid,
        "redelivered": intake.num_redelivered,
        "malformed": malformed,
        "stream_messages_stored": stream_state.last_seq,
        "stream_messages_left": stream_state.messages,
    }


class Reporter:
    def __init__(
        self,
        config: LearnerConfig,
        run_dir: Path,
        *,
        position: dict[str, int] | None = None,
        use_wandb: bool = True,
        on_eval_written: Callable[[Path, int], None] | None = None,
    ) -> None:
        """`position`: the line counts a restored checkpoint recorded (None: a fresh run,
        whose history starts empty). `on_eval_written(directory, version)` is called after
        an eval's files are written (the bucket upload, learner/artifacts.py)."""
        self.on_eval_written = on_eval_written
        position = position or {}
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.num_metrics_lines = position.get("metrics_lines", 0)
        truncate_lines(run_dir / METRICS_FILE, self.num_metrics_lines)
        self.sink = MetricsSink(run_dir, use_wandb=use_wandb, config=config.model_dump(mode="json"))
        self.trained = _JsonLines(run_dir / TRAINED_FILE, position.get("trained_lines", 0))
        self.dropped = _JsonLines(run_dir / DROPPED_FILE, position.get("dropped_lines", 0))
        self._tokenizer = None
        self._model_path = config.model_path
        shown = shows_progress(config.progress, sys.stdout)
        self.progress = ProgressView(config.total_steps) if shown else None

    def position(self) -> dict[str, int]:
        return {
            "metrics_lines": self.num_metrics_lines,
            "trained_lines": self.trained.num_lines,
            "dropped_lines": self.dropped.num_lines,
        }

    def _log(self, record: dict) -> None:
        self.sink.log(record)
        self.num_metrics_lines += 1
        if self.progress is not None:
            for line in self.progress.lines(record):
                print(line, flush=True)

    def record_train(self, record: dict, *, step: int, groups: list[Group]) -> None:
        record.update(rollout_metrics(groups, prefix="rollout/"))
        ids = [i for g in groups for i in g.trajectory_ids]
        self.trained.write(
            {
                "step": step,
                "version": record["version"],
                "trajectory_ids": ids,
                "group_ids": [g.group_id for g in groups],
            }
        )
        self._log(record)
        record_step(record)

    def record_skip(self, record: dict) -> None:
        """A training step skipped for a non-finite loss or gradient (no update)."""
        self._log(record)

    def record_drop(
        self,
        *,
        version: int,
        group_id: str,
        reason: str,
        whole_group: bool,
        trajectory_ids: list[str],
    ) -> None:
        self.dropped.write(
            {
                "version": version,
                "group_id": group_id,
                "reason": reason,
                "whole_group": whole_group,
                "trajectory_ids": trajectory_ids,
            }
        )

    def record_eval(
        self, version: int, groups: list[Group], *, wall_s: float, task_keys: dict[str, str]
    ) -> dict:
        metrics = rollout_metrics(groups)
        oldest = oldest_version(arrays.versions for g in groups for arrays in g.tokens)
        record = {
            "kind": "eval",
            "version": version,
            "wall_s": wall_s,
            "pass_at_1": metrics.get("all/pass_at_1", 0.0),
            "pass_at_n": metrics.get("all/pass_at_n", 0.0),
            "num_prompts": len(groups),
            "samples_per_prompt": len(groups[0].trajectories) if groups else 0,
            **{f"eval/{k}": v for k, v in metrics.items()},
        }
        if oldest is not None:
            record["generated_version_min"] = oldest  # eval tasks run on weights >= version
        write_eval_dump(self.run_dir, version, groups, decode=self._decode, task_keys=task_keys)
        written = write_aggregated_results(self.run_dir, version, record)
        if self.on_eval_written is not None:
            self.on_eval_written(written.parent, version)
        self._log(record)
        # An eval finishes after later steps: its version must not move the version gauge.
        record_step({k: v for k, v in record.items() if k != "version"})
        return record

    def record_done(self, summary: dict) -> None:
        self._log(summary)
        record_step(summary)
        (self.run_dir / DONE_FILE).write_text(json.dumps(summary, indent=2) + "\n")

    def _decode(self, token_ids: list[int]) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        return self._tokenizer.decode(token_ids)

    def close(self) -> None:
        self.trained.close()
        self.dropped.close()
        self.sink.close()
