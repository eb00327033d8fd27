"""The meeting point of a weight round: the learner's TCPStore, its key layout, and who takes
which rank. Each round has its own key prefix, so its process group neither needs nor
disturbs anyone's default group.

    tether/weights/timeouts               the learner's join/transfer timeouts (JSON)
    tether/weights/latest                 newest announced version ("closed" at the end)
    tether/weights/members/next_id        member ids are handed out by an atomic add
    tether/weights/members/<id>           alive | evicted | left
    tether/weights/round/<v>/backend      gloo | nccl
    tether/weights/round/<v>/join/<id>    slots (engine workers) the member brings
    tether/weights/round/<v>/roster       {"world_size", "ranks": {id: first rank}}
    tether/weights/round/<v>/pg/...       the round's process group (torch's own keys)

torch is imported inside functions so that configs importing this package stay fast.
"""

from __future__ import annotations

import socket
from datetime import timedelta

PREFIX = "tether/weights"
CLOSED = "closed"
TIMEOUTS_KEY = "timeouts"
POLL_S = 0.005


def assign_ranks(joined: dict[int, int]) -> tuple[dict[str, int], int]:
    """{member id: slots} -> ({member id: its first rank}, world size). The sender is rank
    0; members follow in id order, each taking `slots` consecutive ranks."""
    ranks, next_rank = {}, 1
    for member_id in sorted(joined):
        if joined[member_id] < 1:
            raise ValueError(f"member {member_id} asks for {joined[member_id]} slots")
        ranks[str(member_id)] = next_rank
        next_rank += joined[member_id]
    return ranks, next_rank


def round_key(version: int, key: str) -> str:
    return f"round/{version}/{key}"


def connect_store(host: str, port: int, *, is_master: bool, timeout_s: float):
    """A TCPStore client, or with `is_master` the server, listening on `host` only (port 0:
    a free one) rather than on every interface."""
    import torch.distributed as dist

    listen_fd = None
    if is_master:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listen_fd = socket.create_server((host, port), family=family, backlog=1024).detach()
    return dist.TCPStore(
        host,
        port,
        is_master=is_master,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=listen_fd,
        use_libuv=True,
    )


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
