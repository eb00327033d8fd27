"""A learner's side of the weight broadcast that a test can kill (sender_process.py in a
process of its own): start it, take a seat in its round, kill it, or read when it exited
by itself. Used by the weight tests and the vLLM engine's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from weights.actor_side.subscription import WeightSubscription
from weights.shared.protocol import RoundTicket

REPO = Path(__file__).resolve().parents[2]
SENDER = Path(__file__).with_name("sender_process.py")
VERSION = 5
ENDS_WITHIN_S = 2.0


def start_sender(port: int, mode: str) -> tuple[subprocess.Popen, int]:
    """A learner's store (and with `hold` / `die_after_go` its round VERSION) in a process
    of its own; returns it and its port."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(SENDER), str(port), str(VERSION), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    word, bound = proc.stdout.readline().split()
    assert word == "listening"
    return proc, int(bound)


def kill(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
    if proc is not None:
        proc.wait(timeout=10)


def seat(mode: str) -> tuple[subprocess.Popen, WeightSubscription, RoundTicket]:
    """A sender process running round VERSION, and our seat in it."""
    proc, port = start_sender(0, mode)
    subscription = WeightSubscription("127.0.0.1", port)
    ticket = subscription.wait_round(-1, 30.0)
    assert ticket is not None and ticket.version == VERSION
    return proc, subscription, ticket


def exited_at(proc: subprocess.Popen) -> float:
    """time.time() at which a `die_after_go` sender exited mid-transfer."""
    word, when = proc.stdout.readline().split()
    assert word == "exiting"
    return float(when)
