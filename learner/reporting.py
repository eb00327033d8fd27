"""What the learner loop reports, in one place: each training step and each eval become a
record in metrics.jsonl (and W&B) and update Prometheus; evals also dump their trajectories;
trained trajectory ids go to trained.jsonl (the run's exact training history).
"""

from __future__ import annotations

import json
from pathlib import Path

from broker.codec import token_arrays
from learner import prom
from learner.batching import Group
from learner.config import LearnerConfig
from learner.env_metrics import rollout_metrics
from learner.eval_dump import write_aggregated_results, write_eval_dump
from learner.sinks import MetricsSink
from learner.staleness import oldest_version

TRAINED_FILE = "trained.jsonl"


class Reporter:
    def __init__(self, config: LearnerConfig, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.sink = MetricsSink(run_dir, config=config.model_dump(mode="json"))
        self._tokenizer = None
        self._model_path = config.model_path
        self._trained = open(run_dir / TRAINED_FILE, "a", encoding="utf-8")  # closed in close()

    def truncate_history(self, version: int) -> None:
        """After a resume from `version`: forget trained-id lines of later versions (their
        training was lost with the crash and is redone)."""
        self._trained.close()
        path = self.run_dir / TRAINED_FILE
        kept = [
            line
            for line in path.read_text().splitlines()
            if line and json.loads(line)["version"] <= version
        ]
        path.write_text("".join(line + "\n" for line in kept))
        self._trained = open(path, "a", encoding="utf-8")

    def record(self, record: dict, *, groups: list[Group] | None = None) -> None:
        if groups:
            record.update(rollout_metrics(groups, prefix="rollout/"))
            self._trained.write(
                json.dumps(
                    {
                        "version": record["version"],
                        "trajectory_ids": [t.trajectory_id for g in groups for t in g.trajectories],
                    }
                )
                + "\n"
            )
            self._trained.flush()
        self.sink.log(record)
        prom.record_step(record)

    def record_eval(self, version: int, groups: list[Group], wall_s: float) -> dict:
        metrics = rollout_metrics(groups)
        oldest = oldest_version(token_arrays(t).versions for g in groups for t in g.trajectories)
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
        write_eval_dump(self.run_dir, version, groups, decode=self._decode)
        write_aggregated_results(self.run_dir, version, record)
        self.sink.log(record)
        prom.record_step(record)
        return record

    def _decode(self, token_ids: list[int]) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        return self._tokenizer.decode(token_ids)

    def close(self) -> None:
        self._trained.close()
        self.sink.close()
