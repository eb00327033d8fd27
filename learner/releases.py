"""Releasing prompts, written ahead: how many the staleness bound admits now
(learner/dispatcher.py) is counted in the ledger and written to `dispatcher.json` (and the
bucket, when one is set) before the prompts are published, by task id (stored once).

A resumed learner reads the write-ahead: what the lost run released beyond its checkpoint
counts as released, and is published again (the broker keeps one copy of each task id), so
the resumed learner waits for every group the lost run released (docs/reliability.md).

The write-ahead and the checkpoint cursor also hold the run id that every task id carries
(`start_run`): a learner with neither to resume from starts a new run with a new id.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from broker import client, runs
from broker.retry import until_done
from common.files import write_atomically
from learner import dispatcher as dispatch
from learner.config import LearnerConfig
from learner.data import load_dataset
from learner.difficulty import DifficultyFilter
from learner.ledger import Ledger

log = logging.getLogger(__name__)

DISPATCH_FILE = "dispatcher.json"


@dataclass(frozen=True)
class WriteAhead:
    """What `dispatcher.json` holds."""

    run_id: str
    num_released: int
    difficulty: dict | None = None
    """The prompt stream's state after those releases, with difficulty filtering."""


@dataclass(frozen=True)
class RunStart:
    """Which run a learner process carries on (or starts), and what it was written ahead."""

    run_id: str
    fresh: bool
    """A new run: nothing to resume from (or `learner.checkpoint.resume` off)."""
    write_ahead: WriteAhead | None


def read_write_ahead(checkpoint_root: str | Path, *, namespace: str) -> WriteAhead | None:
    """The write-ahead in `checkpoint_root`, None without one. One written before run ids
    carries on the ids it released, `<namespace>-<i>`."""
    path = Path(checkpoint_root) / DISPATCH_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return WriteAhead(data.get("run_id", namespace), data["num_released"], data.get("difficulty"))


def start_run(config: LearnerConfig, *, namespace: str, checkpoint_cursor: dict | None) -> RunStart:
    """The run id of this learner: its checkpoint's (`checkpoint_cursor`, None when it
    resumes none), else its write-ahead's (a run lost before its first checkpoint), else a
    new one. A checkpoint from before run ids carries on `<namespace>-<i>` too."""
    write_ahead = None
    if config.checkpoint.resume:
        write_ahead = read_write_ahead(config.checkpoint.dir, namespace=namespace)
    if checkpoint_cursor is not None:
        run_id = checkpoint_cursor.get("run_id", namespace)
    elif write_ahead is not None:
        run_id = write_ahead.run_id
        log.warning(
            "resuming run %s from its write-ahead %s (%d prompts released, no checkpoint yet)",
            run_id,
            Path(config.checkpoint.dir) / DISPATCH_FILE,
            write_ahead.num_released,
        )
    else:
        run_id = dispatch.new_run_id(namespace)
        log.info("run %s starts anew (nothing to resume in %s)", run_id, config.checkpoint.dir)
        return RunStart(run_id, fresh=True, write_ahead=None)
    if write_ahead is not None and write_ahead.run_id != run_id:
        log.warning(
            "ignoring %s of run %s (resuming %s)", DISPATCH_FILE, write_ahead.run_id, run_id
        )
        write_ahead = None
    return RunStart(run_id, fresh=False, write_ahead=write_ahead)


async def open_releases(
    config: LearnerConfig,
    ledger: Ledger,
    *,
    js,
    names,
    checkpoint_cursor: dict | None,
    artifacts=None,
) -> Releases:
    """The releases of this learner's run (`start_run`), its namespace marked as held by
    the run; a new run first empties the namespace's queues of an earlier run's leftovers
    (broker/runs.py)."""
    start = start_run(config, namespace=names.namespace, checkpoint_cursor=checkpoint_cursor)
    await until_done(
        lambda: runs.begin_run(js, names, start.run_id, fresh=start.fresh), "run start"
    )
    difficulty = config.difficulty
    stream = dispatch.PromptStream(
        load_dataset(config.train_data),
        run_id=start.run_id,
        group_size=config.group_size,
        prompts_per_step=config.prompts_per_step,
        max_staleness=1 if config.adaptive_staleness else config.max_staleness,  # "auto": 1
        seed=config.seed,
        difficulty=DifficultyFilter(difficulty, config.seed) if difficulty.enabled else None,
    )
    cursor = checkpoint_cursor or {}
    stream.restore(
        cursor.get("difficulty"),
        start.write_ahead.difficulty if start.write_ahead else None,
        checkpointed=cursor.get("num_released", 0),
    )
    return Releases(
        config,
        ledger,
        stream,
        js=js,
        names=names,
        write_ahead=start.write_ahead,
        artifacts=artifacts,
    )


class Releases:
    def __init__(
        self,
        config: LearnerConfig,
        ledger: Ledger,
        stream: dispatch.PromptStream,
        *,
        js,
        names,
        write_ahead: WriteAhead | None = None,
        artifacts=None,
    ) -> None:
        """`write_ahead`: the lost run's (`RunStart.write_ahead`), of `stream`'s run."""
        self.config = config
        self.ledger = ledger
        self.stream = stream
        self.js = js
        self.names = names
        self.artifacts = artifacts  # learner.artifacts.ArtifactSync when a bucket is set
        self.path = Path(config.checkpoint.dir) / DISPATCH_FILE
        self.published = ledger.num_released  # below: on the bus; above: written ahead only
        if write_ahead is not None:
            assert write_ahead.run_id == stream.run_id, "a write-ahead of another run"
            ledger.num_released = max(ledger.num_released, write_ahead.num_released)

    @property
    def run_id(self) -> str:
        return self.stream.run_id

    async def finish_run(self) -> None:
        """Mark the namespace's run done: it releases nothing more, and once every actor
        left, the server may reclaim the namespace (broker/runs.py)."""
        await until_done(
            lambda: runs.mark_run(self.js, self.names, self.run_id, runs.DONE), "run marker"
        )

    async def release(self, version: int) -> None:
        """Release what `version` admits (written ahead, then published), and publish what
        was written ahead and not published yet."""
        cfg = self.config
        count = dispatch.num_releasable(
            version=version,
            num_released=self.ledger.num_released,
            num_dropped_groups=self.ledger.num_dropped_groups,
            prompts_per_step=cfg.prompts_per_step,
            max_staleness=self.stream.max_staleness,  # the bound in force
            total_steps=cfg.total_steps,
        )
        if count > 0:
            for index in range(self.ledger.num_released, self.ledger.num_released + count):
                self.stream.row_of(index)  # chosen before the write-ahead, which keeps them
            self.ledger.num_released += count
            ahead = json.dumps(
                {"run_id": self.stream.run_id, "num_released": self.ledger.num_released}
                | ({"difficulty": state} if (state := self.stream.state()) else {})
            )
            write_atomically(self.path, ahead)
            if self.artifacts is not None:  # a fresh machine resuming from the bucket needs it
                await asyncio.to_thread(self.artifacts.dispatcher_written, self.path)
        unpublished = range(self.published, self.ledger.num_released)
        tasks = [self.stream.task(i, version=version) for i in unpublished]
        await client.publish_prompts(self.js, self.names, tasks)  # by task id: stored once
        self.published = self.ledger.num_released
