"""Releasing prompts, written ahead: how many the staleness bound admits now
(learner/dispatcher.py) is counted in the ledger and written to `dispatcher.json` (and the
bucket, when one is set) before the prompts are published, by task id (stored once).

A resumed learner reads the write-ahead: what the lost run released beyond its checkpoint
counts as released, and is published again (the broker keeps one copy of each task id), so
the resumed learner waits for every group the lost run released (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from broker import client
from common.files import write_atomically
from learner import dispatcher as dispatch
from learner.config import LearnerConfig
from learner.ledger import Ledger

DISPATCH_FILE = "dispatcher.json"


class Releases:
    def __init__(
        self,
        config: LearnerConfig,
        ledger: Ledger,
        stream: dispatch.PromptStream,
        *,
        js,
        names,
        artifacts=None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.stream = stream
        self.js = js
        self.names = names
        self.artifacts = artifacts  # learner.artifacts.ArtifactSync when a bucket is set
        self.path = Path(config.checkpoint.dir) / DISPATCH_FILE
        self.published = ledger.num_released  # below: on the bus; above: written ahead only
        if config.checkpoint.resume and self.path.is_file():
            released = json.loads(self.path.read_text())["num_released"]
            ledger.num_released = max(ledger.num_released, released)

    async def release(self, version: int) -> None:
        """Release what `version` admits (written ahead, then published), and publish what
        was written ahead and not published yet."""
        cfg = self.config
        count = dispatch.num_releasable(
            version=version,
            num_released=self.ledger.num_released,
            num_dropped_groups=self.ledger.num_dropped_groups,
            prompts_per_step=cfg.prompts_per_step,
            max_staleness=cfg.max_staleness,
            total_steps=cfg.total_steps,
        )
        if count > 0:
            self.ledger.num_released += count
            ahead = json.dumps({"num_released": self.ledger.num_released})
            write_atomically(self.path, ahead)
            if self.artifacts is not None:  # a fresh machine resuming from the bucket needs it
                await asyncio.to_thread(self.artifacts.dispatcher_written, self.path)
        unpublished = range(self.published, self.ledger.num_released)
        tasks = [self.stream.task(i, version=version) for i in unpublished]
        await client.publish_prompts(self.js, self.names, tasks)  # by task id: stored once
        self.published = self.ledger.num_released
