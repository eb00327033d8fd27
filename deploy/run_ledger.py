"""A run's books, from its own records, and whether they balance: what the fault suite and
`make soak` check after every run that something was killed in.

    training prompts released  = groups trained + groups dropped whole (or filtered), each
                                  id once
    trajectories stored         = trained + dropped (by reason) + filtered + eval + malformed
                                  + still in the stream at the end

Filtered: groups without reward signal that dynamic sampling set aside (learner/ledger.py).
    no trajectory trained twice, none both trained and dropped; versions 1..N in order

The records are the learner's: `metrics.jsonl` (its `done` record holds the stream's and
the ledger's totals), `trained.jsonl` and `dropped.jsonl` (the exact history: cut back to
the checkpoint on every resume, so what a crash undid appears once, when it was redone).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from learner.ledger import FILTERED


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class RunLedger:
    done: dict
    """The learner's final record."""
    trained: list[dict]
    """trained.jsonl: one line per step."""
    dropped: list[dict]
    """dropped.jsonl: one line per dropped group (`whole_group`), or per reason samples were
    removed from a trained group."""
    evals: list[dict]
    """The eval records of metrics.jsonl."""
    train_records: list[dict]
    """The train records of metrics.jsonl."""

    @classmethod
    def read(cls, run_dir: Path) -> RunLedger:
        records = read_jsonl(Path(run_dir) / "metrics.jsonl")
        done = [r for r in records if r["kind"] == "done"]
        if not done:
            raise ValueError(f"{run_dir}: the learner never finished (no done record)")
        return cls(
            done=done[-1],
            trained=read_jsonl(Path(run_dir) / "trained.jsonl"),
            dropped=read_jsonl(Path(run_dir) / "dropped.jsonl"),
            evals=[r for r in records if r["kind"] == "eval"],
            train_records=[r for r in records if r["kind"] == "train"],
        )

    # ---- the counts ----------------------------------------------------------------------------

    @property
    def trained_ids(self) -> Counter[str]:
        return Counter(i for line in self.trained for i in line["trajectory_ids"])

    @property
    def dropped_ids(self) -> Counter[str]:
        """Every trajectory set aside, dropped or filtered."""
        return Counter(i for line in self.dropped for i in line["trajectory_ids"])

    @property
    def dropped_by_reason(self) -> Counter[str]:
        """Trajectories dropped, by reason (the filtered ones apart)."""
        counts: Counter[str] = Counter()
        for line in self.dropped:
            if line["reason"] != FILTERED:
                counts[line["reason"]] += len(line["trajectory_ids"])
        return counts

    @property
    def num_filtered(self) -> int:
        return sum(
            len(line["trajectory_ids"]) for line in self.dropped if line["reason"] == FILTERED
        )

    @property
    def taken_groups(self) -> Counter[str]:
        """Prompt task ids trained on or dropped whole."""
        trained = [g for line in self.trained for g in line["group_ids"]]
        dropped = [line["group_id"] for line in self.dropped if line["whole_group"]]
        return Counter(trained + dropped)

    @property
    def eval_samples_recorded(self) -> int:
        return sum(r["num_prompts"] * r["samples_per_prompt"] for r in self.evals)

    def summary(self) -> dict[str, int | dict]:
        d = self.done
        return {
            "prompts_released": d["released_groups"],
            "groups_taken": sum(self.taken_groups.values()),
            "stored": d["stream_messages_stored"],
            "trained": sum(self.trained_ids.values()),
            "dropped": sum(self.dropped_by_reason.values()),
            "dropped_by_reason": dict(self.dropped_by_reason),
            "filtered": self.num_filtered,
            "eval": d["eval_trajectories"],
            "eval_recorded": self.eval_samples_recorded,
            "malformed": d["malformed"],
            "left_in_stream": d["stream_messages_left"],
            "versions": len(self.train_records),
            # Episodes continued from a dead replica's checkpoint (docs/reliability.md).
            **{k: d.get(k, 0) for k in ("resumed_episodes", "resumed_turns", "resumed_tokens")},
        }

    # ---- the checks ----------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Every way the books fail to balance (empty: they balance exactly)."""
        out = []
        trained, dropped = self.trained_ids, self.dropped_ids
        twice = sorted(i for i, n in trained.items() if n > 1)
        if twice:
            out.append(f"trained twice: {twice[:5]} ({len(twice)})")
        if any(n > 1 for n in dropped.values()):
            out.append("a trajectory was dropped twice")
        if both := set(trained) & set(dropped):
            out.append(f"trained and dropped: {sorted(both)[:5]}")
        d = self.done
        released = [f"{d['run_id']}-{i}" for i in range(d["released_groups"])]
        taken = self.taken_groups
        if lost := [g for g in released if taken[g] == 0]:
            out.append(f"released prompts never trained or dropped: {lost[:5]} ({len(lost)})")
        if repeated := [g for g, n in taken.items() if n > 1]:
            out.append(f"groups taken twice: {repeated[:5]}")
        if unknown := sorted(set(taken) - set(released)):
            out.append(f"groups taken that were never released: {unknown[:5]}")
        s = self.summary()
        parts = ("trained", "dropped", "filtered", "eval", "malformed", "left_in_stream")
        if s["stored"] != sum(s[part] for part in parts):
            out.append(
                f"stored {s['stored']} != " + " + ".join(f"{part} {s[part]}" for part in parts)
            )
        if any(d.get(total, 0) != s[total] for total in ("trained", "dropped", "filtered")):
            out.append(f"the done record's totals disagree with the history: {d} vs {s}")
        if Counter(d["dropped_by_reason"]) != self.dropped_by_reason:
            out.append("the done record's drop reasons disagree with dropped.jsonl")
        if s["eval"] < s["eval_recorded"]:
            out.append(f"eval samples recorded {s['eval_recorded']} > acked {s['eval']}")
        versions = [r["version"] for r in self.train_records]
        if versions != list(range(1, len(versions) + 1)) or versions[-1:] != [d["version"]]:
            out.append(f"versions are not 1..{d['version']} in order: {versions}")
        return out
