"""A receiver process for the weight-round tests: one engine's membership and one worker's
long-lived channel, following every round like an engine does.

    python receiver_process.py HOST:PORT ROUNDS [die|hang|lose AT_ROUND] [--until VERSION]

Prints "ready" once registered, then one JSON line per round received (its version, group,
names and checksum). With `die K` it exits in the middle of its K-th round (after the first
tensor arrived); with `hang K` it stops there and sleeps; with `lose K` it receives its K-th
round whole, then acts as if it had missed it (its delta book goes back a version). With
`--until V` it also stops once it has handled version V, received or failed: a round another
receiver broke may or may not have reached this one whole, and the caller knows only the
version it ends on.
"""

from __future__ import annotations

import json
import os
import sys
import time

from weights.actor_side.subscription import WeightSubscription
from weights.engine_side.receiver import RoundMissed, WeightChannel
from weights.shared.tensors import checksum


def main() -> None:
    args = sys.argv[1:]
    until = float("inf")
    if "--until" in args:
        at = args.index("--until")
        until = int(args[at + 1])
        del args[at : at + 2]
    host, port = args[0].rsplit(":", 1)
    rounds = int(args[1])
    fault, fault_at = (args[2], int(args[3])) if len(args) > 3 else ("", -1)
    subscription = WeightSubscription(host, int(port))
    channel = WeightChannel()
    print("ready", flush=True)
    version, received = -1, 0
    while received < rounds and version < until:
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
