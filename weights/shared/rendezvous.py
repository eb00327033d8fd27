"""The meeting point of the weight broadcast: the learner's TCPStore and its key layout.
Groups and rounds have their own key prefixes, so their process groups neither need nor
disturb anyone's default group.

    tether/weights/info                   the store's id (new in every learner process), the
                                          learner's timeouts, dtype, backend, GPU, payload
                                          ("full" or "lora") and adapter config (JSON)
    tether/weights/latest                 newest announced version ("closed" at the end)
    tether/weights/members/next_id        member ids are handed out by an atomic add
    tether/weights/members/<id>           alive | evicted | left
    tether/weights/members/<id>/slots     engine workers (ranks) the member brings
    tether/weights/group/<g>/roster       group g: {"group_id", "backend", "world_size",
                                          "slots", "ranks": {id: first rank}}
    tether/weights/group/<g>/pg/...       group g's process group (torch's own keys)
    tether/weights/round/<v>/group        the group round v is planned on ("none": nobody)
    tether/weights/round/<v>/ready/<id>   the member's workers that are ready to receive
    tether/weights/round/<v>/go           the group round v is sent on, or "skip"
    tether/weights/round/<v>/done/<id>    the member's workers that received all of round v
    tether/weights/round/<v>/failed       set when the sender gave round v up (its error)

torch is imported inside functions so that configs importing this package stay fast.
"""

from __future__ import annotations

import json
import socket
from datetime import timedelta

PREFIX = "tether/weights"
CLOSED = "closed"
INFO_KEY = "info"
NO_GROUP = "none"
SKIP = "skip"
POLL_S = 0.005


def key(name: str) -> str:
    return f"{PREFIX}/{name}"


def round_key(version: int, name: str) -> str:
    return key(f"round/{version}/{name}")


def roster_key(group_id: int) -> str:
    return key(f"group/{group_id}/roster")


def store_id_of(store) -> str:
    """The id of the learner process serving `store` (its info's `store_id`)."""
    return json.loads(store.get(key(INFO_KEY))).get("store_id", "")


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


def is_listening(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts connections at host:port (one plain connect). Asked before
    a TCPStore client connects where a learner may be gone or restarting: torch's client
    retries a refused connection with a backoff that grew past 7 s, long after the
    restarted learner's store was up."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
