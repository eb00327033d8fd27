"""Evals: every `interval` versions (and at the end) the eval set is released pinned to the
current version; its groups come back through the intake and are recorded once complete.

Eval tasks carry `min_version = version`, so they run on weights at least that new; they are
never trained on. An eval in flight when the learner dies runs again only if the successor
resumes at that very version (from a checkpoint of it); one older than the checkpoint it
resumes from is lost, its version's weights with it (its groups, redelivered, are ignored:
task ids, `<run id>-<process>-eval<version>-<i>`, are unique per learner process).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from broker.wire import PromptTask
from learner import dispatcher as dispatch
from learner.batching import Group
from learner.data import Row, task_key

log = logging.getLogger(__name__)


class Evals:
    def __init__(
        self,
        rows: list[Row],
        *,
        interval: int | None,
        samples_per_prompt: int,
        run_id: str,
        results: dict[int, dict],
        record: Callable[[int, list[Group], dict[str, str]], dict],
    ) -> None:
        """`run_id`: the run's (learner/releases.py `start_run`). `results` is the ledger's
        {version: eval record}, filled in place; `record` reports one finished eval (groups,
        their task keys) and returns its record."""
        self.rows = rows
        self.interval = interval
        self.samples_per_prompt = samples_per_prompt
        self.run_id = f"{run_id}-{uuid.uuid4().hex[:8]}"  # unique per learner process
        self.results = results
        self.record = record
        self.version_of: dict[str, int] = {}  # eval group id -> version it evaluates
        self.pending: dict[int, list[Group]] = {}

    def runs_at(self, version: int, *, last_version: int) -> bool:
        """Whether an eval will run pinned to `version` (every `interval`, and the last)."""
        if self.interval is None or not self.rows:
            return False
        return version % self.interval == 0 or version == last_version

    def due(self, version: int, *, final: bool = False) -> list[PromptTask]:
        """The eval tasks to release now (none when no eval is due at `version`)."""
        if self.interval is None or not self.rows:
            return []
        due = final or version % self.interval == 0
        if not due or version in self.results or version in self.pending:
            return []
        tasks = dispatch.eval_tasks(
            self.rows,
            run_id=self.run_id,
            version=version,
            samples_per_prompt=self.samples_per_prompt,
        )
        self.version_of.update({t.task_id: version for t in tasks})
        self.pending[version] = []
        return tasks

    def on_group(self, group: Group) -> None:
        """A complete eval group arrived (the intake calls this)."""
        version = self.version_of.pop(group.group_id, None)
        if version is None:
            return  # an eval released by an earlier learner process
        groups = self.pending[version]
        groups.append(group)
        if len(groups) < len(self.rows):
            return
        del self.pending[version]
        task_keys = {
            f"{self.run_id}-eval{version}-{i}": task_key(row) for i, row in enumerate(self.rows)
        }
        self.results[version] = self.record(version, groups, task_keys)

    async def wait(self, timeout_s: float) -> None:
        """Until every released eval finished, or `timeout_s` passed (then say which not)."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.pending:
            log.warning("evals at versions %s did not finish", sorted(self.pending))
