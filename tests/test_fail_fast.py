"""What cannot heal fails fast, what can heal waits with a clear line:
each role's real command line as a subprocess, its exit code, its one line (no traceback)
and the time to it. The bounds are generous (a loaded 2-core machine); what each took here
is in docs/running.md ("When something is wrong at start-up")."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.procs import free_port
from common.supervision import EXIT_CONFIG, EXIT_UNREACHABLE

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = REPO / "demo" / "tiny_model"
LEARNER = ["learner.cli", "--config", "configs/learner_test.toml", "learner.eval_interval=null"]
ACTOR = ["actors.cli", "--config", "configs/demo.toml", "--replicas"]
MODEL = f"actor.engine.model={TINY_MODEL}"
BOUND_S = 30.0  # to the line: seconds at most, on a loaded machine


class Run:
    """A role's command line running, its output lines timed from its start."""

    def __init__(self, args: list[str], *, cwd: Path = REPO) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.ended = False
        self._new_line = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._new_line:
                self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))
                self._new_line.notify_all()
        with self._new_line:
            self.ended = True
            self._new_line.notify_all()

    def line(self, text: str, timeout_s: float = 60.0) -> tuple[float, str]:
        """(seconds from the start, the line) of the first line holding `text`."""
        deadline = time.monotonic() + timeout_s
        with self._new_line:
            while time.monotonic() < deadline:
                for at, line in self.lines:
                    if text in line:
                        return at, line
                if self.ended:
                    break
                self._new_line.wait(0.5)
        raise AssertionError(f"no line with {text!r}:\n{self.output}")

    def wait(self, timeout_s: float = 90.0) -> int:
        try:
            return self.process.wait(timeout_s)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _fails_at_once(args: list[str], text: str, code: int = EXIT_CONFIG) -> tuple[float, str]:
    run = Run(args)
    assert run.wait() == code, run.output
    at, line = run.line(text, timeout_s=5)
    assert at < BOUND_S and "Traceback" not in run.output, run.output
    return at, line


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def taken_port_above_a_free_one():
    """A held port whose neighbour below was free when looked at: replica 0 of an actor
    started on the neighbour binds it, and replica 1 meets the held one. Other tests bind
    ports of their own meanwhile, so any one neighbour may be taken: look until one is not."""
    for _ in range(100):
        with socket.socket() as held:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", 0))
            held.listen()
            port = held.getsockname()[1]
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port - 1))
                except OSError:
                    continue
            yield port
            return
    raise RuntimeError("no free port below a free one in 100 tries")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    rows = [
        {
            "data_source": "t",
            "env_class": "calculator",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_spec": {"ground_truth": str(i + 1)},
        }
        for i in range(8)
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows[6]["prompt"][0]["role"] = "assistant"
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


# ---- learner -------------------------------------------------------------------------------


def test_learner_a_model_path_that_does_not_exist(data):
    _, line = _fails_at_once(
        [*LEARNER, "learner.model_path=/models/nope", f"learner.train_data={data}/train.jsonl"],
        "learner: learner.model_path: /models/nope does not exist",
    )


def test_learner_fresh_where_the_bucket_holds_an_earlier_runs_checkpoints(
    data, s3_storage, tmp_path
):
    """`--fresh` would mix the new run's checkpoints with the bucket's old ones: refused,
    before anything is moved aside locally."""
    from common.s3 import ObjectStore
    from tests.s3_server import overrides

    storage = s3_storage()
    layout = storage.layout("freshcheck")
    ObjectStore(storage).put_bytes(layout.directory("checkpoint", 5) + "x", b"x")
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "step_5").mkdir(parents=True)
    _fails_at_once(
        [*LEARNER[:1], "--fresh", *LEARNER[1:], f"learner.model_path={TINY_MODEL}",
         f"learner.train_data={data}/train.jsonl", "broker.namespace=freshcheck",
         f"learner.checkpoint.dir={checkpoints}", *overrides(storage)],
        f"learner --fresh: s3://{storage.bucket}/{layout.prefix}/ holds checkpoints of an "
        "earlier run (steps 5-5)",
    )  # fmt: skip
    assert (checkpoints / "step_5").is_dir()  # not moved aside


def test_learner_a_malformed_dataset_is_file_line_field(data):
    _, line = _fails_at_once(
        [*LEARNER, f"learner.model_path={TINY_MODEL}", f"learner.train_data={data}/bad.jsonl"],
        f"learner: {data}/bad.jsonl:7: prompt[0].role: expected 'system' or 'user'",
    )


def test_learner_a_missing_dataset_names_the_key(data):
    _fails_at_once(
        [*LEARNER, f"learner.model_path={TINY_MODEL}", f"learner.train_data={data}/nope.jsonl"],
        f"learner: learner.train_data: dataset {data}/nope.jsonl does not exist",
    )


def test_learner_a_taken_metrics_port_names_the_key(data, taken_port):
    _fails_at_once(
        [
            *LEARNER,
            f"learner.model_path={TINY_MODEL}",
            f"learner.train_data={data}/train.jsonl",
            f"learner.metrics_port={taken_port}",
        ],
        f"learner: port {taken_port} on 127.0.0.1 is not free",
    )


def test_learner_waits_for_the_broker_then_gives_up_with_one_line(data, tmp_path):
    url = f"nats://127.0.0.1:{free_port()}"
    run = Run(
        [
            *LEARNER,
            f"learner.model_path={TINY_MODEL}",
            f"learner.train_data={data}/train.jsonl",
            f"learner.run_dir={tmp_path}/run",
            f"learner.checkpoint.dir={tmp_path}/ckpt",
            f"broker.url={url}",
            "broker.connect_timeout_s=3",
        ]
    )
    assert run.wait() == EXIT_UNREACHABLE, run.output
    waiting, _ = run.line(f"waiting for NATS at {url} (is `python -m broker serve` running?)")
    gave_up, _ = run.line(f"learner: NATS at {url} did not answer within 3s")
    assert waiting < BOUND_S and 2.5 < gave_up - waiting < 3.0 + BOUND_S
    assert "Traceback" not in run.output
    assert sum("waiting for NATS" in line for _, line in run.lines) == 1  # not every 0.5 s


# ---- actor ---------------------------------------------------------------------------------


def test_actor_a_model_path_that_does_not_exist():
    _fails_at_once(
        ["actors.cli", "--config", "configs/demo.toml", "actor.engine.model=/models/nope"],
        "actor: actor.engine.model: /models/nope does not exist",
    )


def test_actor_a_taken_metrics_port_names_the_key_and_the_replica(taken_port_above_a_free_one):
    taken_port = taken_port_above_a_free_one
    _fails_at_once(
        [*ACTOR, "2", MODEL, f"actor.metrics_port={taken_port - 1}"],
        f"actor: port {taken_port} on 127.0.0.1 is not free (Address already in use): set "
        "actor.metrics_port (+1 for replica 1) to a free port",
    )


def _actor(broker_url: str, *overrides: str) -> Run:
    """One replica of the tiny model, pointed at `broker_url`."""
    return Run([*ACTOR, "1", MODEL, "actor.metrics_port=0", f"broker.url={broker_url}", *overrides])


def test_actor_gives_up_on_the_broker_once_without_restarting_the_replica():
    url = f"nats://127.0.0.1:{free_port()}"
    run = _actor(url, "broker.connect_timeout_s=2")
    assert run.wait() == EXIT_UNREACHABLE, run.output
    run.line(f"actor[0]: NATS at {url} did not answer within 2s (broker.connect_timeout_s)")
    run.line("replica 0 exited with 69 (gave up waiting for a peer")
    assert sum("started replica 0" in line for _, line in run.lines) == 1, run.output
    assert "Traceback" not in run.output


def test_actor_names_a_silent_env_server_then_stops_within_5s_of_sigterm():
    """The acceptance case: an actor waiting for an unreachable broker exits within 5 s of
    SIGTERM (it took 62.7 s: the replica did not stop while it waited)."""
    env_address = f"127.0.0.1:{free_port()}"
    url = f"nats://127.0.0.1:{free_port()}"
    run = _actor(url, f'actor.env.addresses=["{env_address}"]')
    env_at, _ = run.line(f"env server not answering at {env_address} (UNAVAILABLE")
    broker_at, _ = run.line(f"waiting for NATS at {url}")
    assert env_at < BOUND_S and broker_at < BOUND_S
    signalled = time.monotonic()
    run.process.send_signal(signal.SIGTERM)
    assert run.wait(timeout_s=30) == 0, run.output
    assert time.monotonic() - signalled < 5.0, run.output
    assert "did not stop" not in run.output and "Traceback" not in run.output


def _ready(run: Run, timeout_s: float = 240.0) -> None:
    """Wait until the replica's /readyz answers 200: its engine is up, it pulls work."""
    import re
    import urllib.request

    _, line = run.line("/readyz on port", timeout_s=60)
    port = int(re.search(r"on port (\d+)", line).group(1))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        assert run.process.poll() is None, run.output
        time.sleep(0.5)
    raise AssertionError(f"replica not ready within {timeout_s}s:\n{run.output}")


@pytest.mark.vllm
def test_a_running_actor_stops_within_5s_of_sigterm_and_says_nothing_alarming(nats_server):
    """SIGTERM in the state an actor spends its life in: engine up, broker and env server
    there, no work. It took 6.3 s (the engine core's own teardown, ~3 s, then the
    interpreter's, ~2 s); now about 1.5 s."""
    env_port = free_port()
    env = Run(["envservers.cli", "--env", "calculator", f"envserver.port={env_port}",
               "envserver.metrics_port=0"])  # fmt: skip
    try:
        env.line("envserver ready on", timeout_s=60)
        run = _actor(nats_server.url, f'actor.env.addresses=["127.0.0.1:{env_port}"]')
        _ready(run)
        signalled = time.monotonic()
        run.process.send_signal(signal.SIGTERM)
        assert run.wait(timeout_s=30) == 0, run.output
        took = time.monotonic() - signalled
    finally:
        env.process.send_signal(signal.SIGTERM)
        env.wait(timeout_s=30)
    assert took < 5.0, run.output
    for alarming in ("Traceback", "leaked semaphore", "force killing", "did not stop"):
        assert alarming not in run.output, run.output


# ---- env server ----------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["envserver.port", "envserver.metrics_port"])
def test_envserver_a_taken_port_names_the_key(setting, taken_port):
    other = "envserver.metrics_port=0" if setting == "envserver.port" else "envserver.port=0"
    _fails_at_once(
        ["envservers.cli", "--env", "calculator", other, f"{setting}={taken_port}"],
        f"envserver: port {taken_port} on 127.0.0.1 is not free (Address already in use): set "
        f"{setting} to a free port (0 picks one)",
    )
