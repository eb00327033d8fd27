"""Learner rank 0's side of the weight broadcast: serve the store, run one round per version.

    set round/v/backend, latest=v
    poll round/v/join/* until every alive member joined, or join_timeout_s
    set round/v/roster (id -> first rank); evict members that did not join
    form the round's group (rank 0) and send every bucket (weights/collective.py)

A dead actor costs the sender at most one `join_timeout_s` (then it is evicted and never
waited on again; a live one that was merely slow rejoins by setting itself alive), and a
receiver that joins but dies mid-round fails that round within `transfer_timeout_s`; the
sender reports the failure and the learner carries on. Every round carries full tensors, so
a receiver that missed rounds is current again after the next one it joins. A member that
left (its actor stopped) is given no seat, even if its polling thread had just joined.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weights.collective import round_group, send_buckets
from weights.config import WeightSyncConfig
from weights.rendezvous import (
    CLOSED,
    POLL_S,
    PREFIX,
    TIMEOUTS_KEY,
    assign_ranks,
    connect_store,
    round_key,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def _drain(iterator: Iterator) -> None:
    for _ in iterator:
        pass


@dataclass(frozen=True)
class BroadcastReport:
    version: int
    num_receivers: int
    """Members in the round's roster."""
    num_tensors: int
    num_bytes: int
    join_s: float
    """Time spent waiting for members to join."""
    transfer_s: float
    """Time to form the group and broadcast every bucket."""
    missed: tuple[int, ...] = ()
    """Member ids expected but absent (now evicted)."""
    error: str = ""
    """Why the round failed (empty when it succeeded)."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def mb_per_s(self) -> float:
        return self.num_bytes / 1e6 / self.transfer_s if self.transfer_s > 0 else 0.0


class WeightSender:
    """Learner rank 0: serves the store and broadcasts one round per version.

    `sender = WeightSender(config)`; after each optimizer step
    `sender.broadcast(version, model_named_tensors)` (blocking; run it in a thread from
    async code). Tensors may live on any device; they are streamed bucket by bucket.
    """

    def __init__(self, config: WeightSyncConfig) -> None:
        import torch

        self.backend = config.backend
        if self.backend == "auto":
            self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self._store = connect_store(
            config.store_host,
            config.store_port,
            is_master=True,
            timeout_s=config.transfer_timeout_s,
        )
        # store_port 0 picks a free port; the config then says which one actors must use.
        self.config = config.model_copy(update={"store_port": self._store.port})
        self._store.set(
            f"{PREFIX}/{TIMEOUTS_KEY}",
            json.dumps(
                {
                    "join_timeout_s": config.join_timeout_s,
                    "transfer_timeout_s": config.transfer_timeout_s,
                }
            ),
        )
        self._store.set(f"{PREFIX}/latest", "-1")
        self._last_version: int | None = None

    def _key(self, key: str) -> str:
        return f"{PREFIX}/{key}"

    def members(self) -> dict[int, str]:
        """{member id: state} of every registered subscription: `alive` (expected in the
        next round), `evicted` (missed a round; expected again once it joins one) or `left`."""
        num_ids = self._store.add(self._key("members/next_id"), 0)
        ids = list(range(1, num_ids + 1))
        keys = [self._key(f"members/{i}") for i in ids]
        present = [i for i, key in zip(ids, keys, strict=True) if self._store.check([key])]
        if not present:
            return {}
        values = self._store.multi_get([self._key(f"members/{i}") for i in present])
        return {i: v.decode() for i, v in zip(present, values, strict=True)}

    def _joined(self, version: int, ids: Iterable[int]) -> dict[int, int]:
        out = {}
        for i in ids:
            key = self._key(round_key(version, f"join/{i}"))
            if self._store.check([key]):
                out[i] = int(self._store.get(key))
        return out

    def _gather_roster(self, version: int) -> tuple[dict[int, int], tuple[int, ...]]:
        """Wait until every alive member joined or the join timeout passed; returns
        {member id: slots} of those that joined and the ids that did not (evicted)."""
        deadline = time.monotonic() + self.config.join_timeout_s
        while True:
            states = self.members()
            alive = [i for i, s in states.items() if s == "alive"]
            # A member that left after joining (its actor stopped) gets no seat: nobody
            # would take it, and the round would fail for everyone after transfer_timeout_s.
            joined = self._joined(version, [i for i, s in states.items() if s != "left"])
            if all(i in joined for i in alive) or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        missed = tuple(i for i in alive if i not in joined)
        for i in missed:
            self._store.set(self._key(f"members/{i}"), "evicted")
        return joined, missed

    def broadcast(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> BroadcastReport:
        """Run round `version`: gather the members that join, then stream every tensor to
        them. Never raises for a failed receiver: the report says what happened.

        `named_tensors` is always run to the end, even with nobody to send to or after a
        failure: under FSDP every rank gathers each tensor in lockstep with rank 0's
        iteration, and the other ranks must not be left waiting in an all-gather."""
        if self._last_version is not None and version <= self._last_version:
            raise ValueError(f"version {version} is not newer than {self._last_version}")
        self._last_version = version
        try:
            return self._round(version, iter(named_tensors))
        finally:
            self._forget_rounds_before(version)

    def _forget_rounds_before(self, version: int) -> None:
        """Delete older rounds' keys (join marks, rosters, the groups' own keys), so the
        store does not grow with every step."""
        prefix = self._key("round/")
        for key in self._store.list_keys():
            if key.startswith(prefix) and int(key[len(prefix) :].split("/", 1)[0]) < version:
                self._store.delete_key(key)

    def _round(
        self, version: int, named_tensors: Iterator[tuple[str, torch.Tensor]]
    ) -> BroadcastReport:
        started = time.monotonic()
        self._store.set(self._key(round_key(version, "backend")), self.backend)
        self._store.set(self._key("latest"), str(version))
        joined, missed = self._gather_roster(version)
        roster, world_size = assign_ranks(joined)
        self._store.set(
            self._key(round_key(version, "roster")),
            json.dumps({"world_size": world_size, "ranks": roster}),
        )
        join_s = time.monotonic() - started
        report = dict(
            version=version,
            num_receivers=len(roster),
            num_tensors=0,
            num_bytes=0,
            join_s=join_s,
            transfer_s=0.0,
            missed=missed,
        )
        if not roster:
            _drain(named_tensors)
            return BroadcastReport(**report)
        started = time.monotonic()
        try:
            group = round_group(
                self._store,
                self.config.store_host,
                version,
                0,
                world_size,
                self.backend,
                self.config.transfer_timeout_s,
            )
            num_tensors, num_bytes = send_buckets(
                group,
                named_tensors,
                backend=self.backend,
                bucket_bytes=int(self.config.bucket_mb * 2**20),
            )
        except RuntimeError as e:
            # A receiver died or hung (DistError/gloo errors are RuntimeErrors): this round
            # is lost for everyone in it; the learner goes on, receivers retry next round.
            log.warning("weight round %d failed: %s", version, e)
            _drain(named_tensors)
            report.update(transfer_s=time.monotonic() - started, error=str(e))
            return BroadcastReport(**report)
        report.update(
            num_tensors=num_tensors, num_bytes=num_bytes, transfer_s=time.monotonic() - started
        )
        return BroadcastReport(**report)

    def close(self) -> None:
        self._store.set(self._key("latest"), CLOSED)
        del self._store
