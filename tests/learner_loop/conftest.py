"""Fixtures and helpers of the learner-loop tests: the tiny random model, SkyRL-format prompt
files, the real `learner` CLI as a subprocess, and a log of every announced policy version."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker import client
from broker.codec import decode
from broker.names import BusNames
from broker.wire import PolicyVersion
from common.procs import free_port

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "learner_test.toml"


def _rows(n: int, offset: int) -> list[dict]:
    return [
        {
            "data_source": "calculator",
            "env_class": "calculator",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_spec": {"method": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"task_key": f"add-{i}"},
        }
        for i in range(offset, offset + n)
    ]


@pytest.fixture(scope="session")
def datasets(tmp_path_factory) -> tuple[Path, Path]:
    """(train.jsonl with 12 prompts, eval.jsonl with 2)."""
    root = tmp_path_factory.mktemp("data")
    for name, rows in (("train", _rows(12, 0)), ("eval", _rows(2, 100))):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "train.jsonl", root / "eval.jsonl"


@dataclass
class LearnerRun:
    """One learner run directory and the overrides that point the CLI at it and the bus."""

    run_dir: Path
    overrides: list[str]
    metrics_port: int
    log_path: Path
    process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {**os.environ, "WANDB_MODE": "disabled"}
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes it; closed in wait()
        self._log = log
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "learner.cli",
            "--config",
            str(CONFIG),
            *self.overrides,
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )

    async def wait(self, timeout_s: float) -> int:
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            self.kill()
            await self.process.wait()
            tail = self.log_tail()
            raise AssertionError(f"learner did not finish in {timeout_s}s:\n{tail}") from None
        finally:
            self._log.close()
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def kill_at(self, versions, version: int) -> None:
        """SIGKILL the learner once the KV (`versions`, a bus() watcher) announces
        `version`, and wait for it to be gone."""
        while not versions.versions or versions.versions[-1] < version:
            assert self.process.returncode is None, self.log_tail()
            await asyncio.sleep(0.05)
        os.kill(self.process.pid, signal.SIGKILL)
        assert await self.wait(30) == -signal.SIGKILL

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def records(self, kind: str | None = None) -> list[dict]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line]
        return [r for r in records if kind is None or r.get("kind") == kind]

    def history(self, name: str) -> list[dict]:
        path = self.run_dir / name
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()


@pytest.fixture
def learner_run(tmp_path, tiny_model_dir, datasets, nats_server, bus_names):
    """Factory: `learner_run(**learner_fields)` -> LearnerRun (same run dir on every call)."""
    train, eval_ = datasets
    run_dir = tmp_path / "run"
    port = free_port()

    def make(**fields) -> LearnerRun:
        overrides = [
            f"broker.url={nats_server.url}",
            f"broker.namespace={bus_names.namespace}",
            f"learner.model_path={tiny_model_dir}",
            f"learner.train_data={train}",
            f"learner.eval_data={eval_}",
            f"learner.run_dir={run_dir}",
            f"learner.checkpoint.dir={run_dir / 'checkpoints'}",
            f"learner.metrics_port={port}",
            *(f"learner.{k}={json.dumps(v)}" for k, v in fields.items()),
        ]
        return LearnerRun(run_dir, overrides, port, tmp_path / "learner.log")

    return make


@dataclass
class VersionLog:
    """Every policy version announced in the KV, in order (a KV watcher)."""

    announced: list[PolicyVersion] = field(default_factory=list)

    @property
    def versions(self) -> list[int]:
        return [a.version for a in self.announced]

    async def follow(self, js, names: BusNames) -> None:
        kv = await js.key_value(names.policy_bucket)
        watcher = await kv.watch(names.policy_version_key)
        async for entry in watcher:
            if entry is not None and entry.value:
                self.announced.append(decode(entry.value, PolicyVersion))


@contextlib.asynccontextmanager
async def bus(url: str, names: BusNames):
    """A connection with the run's streams created, and a VersionLog following the KV."""
    nc = await client.connect(url, name="test")
    js = nc.jetstream()
    await client.ensure_streams(js, names)
    log = VersionLog()
    follower = asyncio.create_task(log.follow(js, names))
    try:
        yield js, log
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await nc.close()


@contextlib.asynccontextmanager
async def running(actors):
    """Run scripted actors as tasks; stop and cancel them (handing back held tasks) on exit."""
    tasks = [asyncio.create_task(a.run()) for a in actors]
    try:
        yield tasks
    finally:
        for a, t in zip(actors, tasks, strict=True):
            a.stop()
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r
