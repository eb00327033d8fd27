"""An elastic actor fleet on Ray: what the run's supervisor (deploy/ray_supervisor.py) sizes
it by, and which replicas to start or let go. The size itself is common/fleet.py's rule, the
same the Kubernetes overlay's KEDA and HPA objects and the simulator use.

    every elastic.poll_s:  the learner's /metrics ─► work = pending + ack_pending (prompts)
                           ─► FleetSizer ─► replicas wanted
                           ─► changes(): new replicas take the lowest free numbers, the
                              newest leave first (SIGTERM: each episode is checkpointed at
                              its next turn and its group handed back, actors/replica.py)

A new replica gets a placement group of one actor bundle, on whichever node Ray finds;
`request_resources` tells Ray's autoscaler the fleet's bundles, so a cluster that
autoscales adds a node for it (and may remove one once the fleet shrinks); a fixed cluster
places it where there is room, or it waits, counted in the fleet, until there is.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from common.fleet import FleetBounds, FleetSizer

WORK_GAUGES = ("tether_bus_pending_messages", "tether_bus_ack_pending_messages")
"""Released prompts not taken, and taken but not finished (learner/bus_metrics.py)."""

_REPLICA = re.compile(r"actor-(\d+)")


def work_from_metrics(text: str) -> float | None:
    """Unfinished released groups, from a learner's /metrics text; None until the learner
    has read the bus once (no prompts-queue samples yet)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WORK_GAUGES and sample.labels.get("queue") == "prompts":
                found[sample.name] = sample.value
    if set(found) != set(WORK_GAUGES):
        return None
    return sum(found.values())


def read_work(url: str, timeout_s: float = 2.0) -> float | None:
    """`work_from_metrics` of the learner at `url`; None while it does not answer (starting,
    restarting): the fleet keeps its size rather than shrink on a missing reading."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return work_from_metrics(response.read().decode())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def is_replica(name: str) -> bool:
    """Is `name` an actor replica's role (planned or elastic)?"""
    return _REPLICA.fullmatch(name) is not None


def replica_name(index: int) -> str:
    return f"actor-{index}"


def replica_index(name: str) -> int:
    match = _REPLICA.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not an actor replica's name")
    return int(match.group(1))


def changes(target: int, members: Iterable[str]) -> tuple[list[str], list[str]]:
    """(replicas to start, replicas to let go) that bring `members` (running or starting,
    not those already leaving) to `target`. New ones take the lowest free numbers, so names
    stay small and a restarted run's logs line up; the highest numbers leave first, the
    newest replicas, whose engines have done least."""
    by_index = sorted(replica_index(name) for name in members)
    if target < len(by_index):
        return [], [replica_name(i) for i in reversed(by_index[target:])]
    taken, new, index = set(by_index), [], 0
    while len(by_index) + len(new) < target:
        if index not in taken:
            new.append(replica_name(index))
        index += 1
    return new, []


class FleetWatch:
    """When to read the backlog, and the fleet size each reading asks for. The first
    reading waits `engine_start_s` from the first call: a run whose engines are still
    starting has a backlog that says nothing of the fleet it needs."""

    def __init__(self, spec: dict, replicas: int) -> None:
        self.spec = spec
        self.replicas = replicas
        self.sizer: FleetSizer | None = None
        self._next_read: float | None = None

    def due(self, now: float) -> bool:
        if self._next_read is None:
            self._next_read = now + self.spec["engine_start_s"]
        if now < self._next_read:
            return False
        self._next_read = now + self.spec["poll_s"]
        return True

    def wanted(self, now: float, work: float) -> int:
        if self.sizer is None:
            self.sizer = FleetSizer(FleetBounds(**self.spec["bounds"]), self.replicas, now)
        return self.sizer.observe(now, work)
