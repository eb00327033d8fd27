"""A learner's side of the weight broadcast in a process of its own, so that a test can kill
it the way a learner dies (SIGKILL) and start another on the same port, as the launcher
restarts a learner.

    python sender_process.py PORT VERSION MODE

Serves the store on 127.0.0.1:PORT (0: a free one) and prints "listening <port>", then:
- `idle`: announces nothing and serves until killed (a restarted learner still loading).
- `hold`: once a member registered, registers a phantom member that never gets ready too,
  and runs round VERSION: the round waits (join_timeout_s) for the phantom, so "go" is
  never said before the test kills this process.
- `die_after_go`: once a member registered, runs round VERSION and exits (os._exit, as a
  SIGKILL would end it) after its first bucket left, mid-transfer, printing "exiting
  <time.time()>" just before.

tests/weights/dying_learner.py starts and kills it.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from weights.config import WeightSyncConfig
from weights.learner_side.sender import WeightSender
from weights.shared.rendezvous import key

NUM_TENSORS = 8


def _tensors(version: int, *, die_after: int | None):
    for i in range(NUM_TENSORS):
        if die_after is not None and i == die_after:
            time.sleep(0.2)  # the first bucket is on its way to the receiver
            print(f"exiting {time.time()}", flush=True)
            os._exit(9)
        yield f"w{i}", torch.full((64,), float(version + i))


def main() -> None:
    port, version, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    config = WeightSyncConfig(
        store_port=port, join_timeout_s=10.0, transfer_timeout_s=20.0, bucket_mb=1e-4
    )
    sender = WeightSender(config)
    print(f"listening {sender.config.store_port}", flush=True)
    if mode == "idle":
        time.sleep(3600)
    while not sender.members():
        time.sleep(0.01)
    if mode == "hold":
        store = sender._store
        phantom = store.add(key("members/next_id"), 1)
        store.set(key(f"members/{phantom}/slots"), "1")
        store.set(key(f"members/{phantom}"), "alive")
    sender.broadcast(version, _tensors(version, die_after=1 if mode == "die_after_go" else None))
    time.sleep(3600)


if __name__ == "__main__":
    main()
