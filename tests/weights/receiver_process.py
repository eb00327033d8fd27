"""A receiver process for the weight-round tests: one engine's membership and one worker's
long-lived channel, following every round like an engine does.

    python receiver_process.py HOST:PORT ROUNDS [die|hang|lose AT_ROUND] [--dtype D]

Prints "ready" once registered, then one JSON line per round received (its version, group,
names and checksum). With `die K` it exits in the middle of its K-th round (after the first
tensor arrived); with `hang K` it stops there and sleeps; with `lose K` it receives its K-th
round whole, then acts as if it had missed it (its delta book goes back a version).
"""

from __future__ import annotations

import json
import os
import sys
import time

from weights.receiver import RoundMissed, WeightChannel
from weights.subscription import WeightSubscription
from weights.tensors import checksum


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    rounds = int(sys.argv[2])
    fault, fault_at = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else ("", -1)
    subscription = WeightSubscription(host, int(port))
    channel = WeightChannel()
    print("ready", flush=True)
    version, received = -1, 0
    while received < rounds:
        ticket = subscription.wait_round(version, 60)
        if ticket is None:
            break
        weights = []
        try:
            for name, tensor in channel.receive(ticket):
                weights.append((name, tensor.clone()))
                if received + 1 == fault_at and fault == "die":
                    os._exit(3)
                if received + 1 == fault_at and fault == "hang":
                    time.sleep(3600)
        except (RoundMissed, RuntimeError, TimeoutError, ValueError) as e:
            print(json.dumps({"version": ticket.version, "error": str(e)}), flush=True)
            version = ticket.version
            continue
        version = ticket.version
        received += 1
        if received == fault_at and fault == "lose":
            channel.book.version = version - 1
        print(
            json.dumps(
                {
                    "version": version,
                    "group": channel.group.group_id,
                    "rank": channel.group.rank,
                    "world": channel.group.world_size,
                    "names": [n for n, _ in weights],
                    "checksum": checksum(weights),
                    "book": channel.book.version,
                }
            ),
            flush=True,
        )
    channel.close()
    subscription.leave()


if __name__ == "__main__":
    main()
