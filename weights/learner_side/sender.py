"""Learner rank 0's side of the weight broadcast: serve the store, run one round per version
over a communicator that lives as long as its membership.

    plan the round's group (weights/shared/membership.py): keep the current one, or publish a new
      roster when a member registered, left or was evicted, or the last round failed
    set round/v/group, latest = v
    wait (join_timeout_s) until every member's workers are ready; those that are not are
      evicted and the round goes to a new group without them (round/v/go)
    send every bucket (weights/shared/collective.py), then wait (transfer_timeout_s) until every
      member says it received all of it

A dead or hung receiver costs the sender at most one `join_timeout_s` (not ready: evicted
before any collective starts) or one `transfer_timeout_s` (died mid-round: the group is
aborted, the round fails, and the next round forms a fresh group of whoever is alive). The
sender reports and the learner carries on; every round carries full tensors, so a receiver
that missed rounds is current again after the next one it joins. A member that left (its
actor stopped) is given no seat.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weights.config import WeightSyncConfig
from weights.shared.collective import send_buckets
from weights.shared.communicator import WeightGroup
from weights.shared.delta_book import SenderBook
from weights.shared.membership import Roster, next_roster, without
from weights.shared.rendezvous import (
    CLOSED,
    INFO_KEY,
    NO_GROUP,
    POLL_S,
    PREFIX,
    SKIP,
    connect_store,
    key,
    roster_key,
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
    """Members the round was sent to."""
    num_tensors: int
    num_bytes: int
    join_s: float
    """Time spent planning the group and waiting for members to get ready."""
    transfer_s: float
    """Time to form the group (when new) and broadcast every bucket."""
    missed: tuple[int, ...] = ()
    """Member ids expected but not ready in time (now evicted)."""
    error: str = ""
    """Why the round failed (empty when it succeeded)."""
    group_id: int = -1
    """The group (communicator) the round went over; -1 when none."""
    new_group: bool = False
    """Whether that group was formed for this round (membership changed)."""
    keyframe: bool = True
    """Whether every tensor went whole (always, unless `weight_sync.delta`)."""
    raw_bytes: int = 0
    """The round's tensors in the wire dtype: what a keyframe sends (`num_bytes` is what
    went on the wire)."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def mb_per_s(self) -> float:
        return self.num_bytes / 1e6 / self.transfer_s if self.transfer_s > 0 else 0.0


class WeightSender:
    """Learner rank 0: serves the store and broadcasts one round per version.

    `sender = WeightSender(config, dtype="bfloat16")`; after each optimizer step
    `sender.broadcast(version, named_tensors)` (blocking; run it in a thread from async
    code); `close()` at the end. `dtype` is the learner's (engines of another are refused
    when they subscribe); tensors may live on any device and are streamed bucket by bucket.
    `adapter_config` (a PEFT `adapter_config.json`) says that rounds carry a LoRA adapter
    instead of full weights (weights/formats/adapter.py).
    """

    def __init__(
        self,
        config: WeightSyncConfig,
        *,
        dtype: str = "float32",
        adapter_config: dict | None = None,
    ) -> None:
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
        # A learner restarted on the same address serves another store: tickets of this
        # one name it, so no receiver waits there for a round this process planned.
        self.store_id = uuid.uuid4().hex[:12]
        info = {
            "store_id": self.store_id,
            "join_timeout_s": config.join_timeout_s,
            "transfer_timeout_s": config.transfer_timeout_s,
            "dtype": dtype,
            "backend": self.backend,
            "gpu_uuid": _gpu_uuid() if self.backend == "nccl" else "",
            "payload": "full" if adapter_config is None else "lora",
            "adapter_config": adapter_config,
        }
        self._store.set(key(INFO_KEY), json.dumps(info))
        self._store.set(key("latest"), "-1")
        self._last_version: int | None = None
        self._roster: Roster | None = None
        self._group: WeightGroup | None = None
        self._broken = False
        self._next_group_id = 0
        deltas = config.delta and adapter_config is None
        self._book = SenderBook(config.keyframe_interval) if deltas else None

    # ---- membership ---------------------------------------------------------------------------

    def members(self) -> dict[int, str]:
        """{member id: state} of every registered subscription: `alive` (seated from the next
        group on), `evicted` (not ready in a round; seated again once it asks) or `left`."""
        num_ids = self._store.add(key("members/next_id"), 0)
        ids = [i for i in range(1, num_ids + 1) if self._store.check([key(f"members/{i}")])]
        if not ids:
            return {}
        values = self._store.multi_get([key(f"members/{i}") for i in ids])
        return {i: v.decode() for i, v in zip(ids, values, strict=True)}

    def members_behind(self) -> bool:
        """Whether a live member did not get the last round: it registered (or asked for a
        seat again) after its group was formed, or the round failed. Until the next round
        it can catch up only from a snapshot."""
        seated = self._roster.slots if self._roster is not None and not self._broken else {}
        return any(s == "alive" and i not in seated for i, s in self.members().items())

    def _alive_slots(self) -> dict[int, int]:
        alive = [i for i, state in self.members().items() if state == "alive"]
        if not alive:
            return {}
        values = self._store.multi_get([key(f"members/{i}/slots") for i in alive])
        return {i: int(v) for i, v in zip(alive, values, strict=True)}

    def _publish(self, roster: Roster | None) -> Roster | None:
        if roster is not None and roster is not self._roster:
            self._next_group_id = roster.group_id + 1
            self._store.set(roster_key(roster.group_id), json.dumps(roster.as_json()))
        return roster

    def _wait_for(self, version: int, what: str, roster: Roster, timeout_s: float) -> set[int]:
        """Poll round/v/<what>/<id> until every member's count reaches its slots; returns
        the members that did not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        waiting = dict(roster.slots)
        absent: set[int] = set()
        polls = 0
        while waiting:
            for member_id, slots in list(waiting.items()):
                if self._store.add(round_key(version, f"{what}/{member_id}"), 0) >= slots:
                    del waiting[member_id]
                elif polls % 20 == 0 and self._state(member_id) == "left":
                    del waiting[member_id]  # its actor stopped: nobody will take the seat
                    absent.add(member_id)
            if not waiting or time.monotonic() >= deadline:
                break
            polls += 1
            time.sleep(POLL_S)
        return absent | set(waiting)

    def _state(self, member_id: int) -> str:
        return self._store.get(key(f"members/{member_id}")).decode()

    # ---- rounds -------------------------------------------------------------------------------

    def broadcast(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> BroadcastReport:
        """Run round `version`: stream every tensor to the members that are ready. Never
        raises for a failed receiver: the report says what happened.

        `named_tensors` is always run to the end, even with nobody to send to or after a
        failure: under FSDP every rank gathers each tensor in lockstep with rank 0's
        iteration, and the other ranks must not be left waiting in an all-gather."""
        if self._last_version is not None and version <= self._last_version:
            raise ValueError(f"version {version} is not newer than {self._last_version}")
        self._last_version = version
        named = iter(named_tensors)
        try:
            return self._round(version, named)
        finally:
            _drain(named)
            self._forget_before(version)

    def _round(self, version: int, named: Iterator) -> BroadcastReport:
        started = time.monotonic()
        roster = next_roster(
            self._roster,
            self._alive_slots(),
            broken=self._broken,
            next_id=self._next_group_id,
            backend=self.backend,
        )
        roster = self._publish(roster)
        self._store.set(round_key(version, "group"), str(roster.group_id) if roster else NO_GROUP)
        self._store.set(key("latest"), str(version))
        report = dict(version=version, num_receivers=0, num_tensors=0, num_bytes=0)
        missed: set[int] = set()
        if roster is not None:
            missed = self._wait_for(version, "ready", roster, self.config.join_timeout_s)
        if missed:
            for member_id in missed:  # (a member that left stays left)
                self._store.compare_set(key(f"members/{member_id}"), "alive", "evicted")
            roster = self._publish(without(roster, missed, next_id=self._next_group_id))
        if roster is not None:
            self._store.set(round_key(version, "go"), str(roster.group_id))
        elif missed:
            self._store.set(round_key(version, "go"), SKIP)
        report.update(join_s=time.monotonic() - started, missed=tuple(sorted(missed)))
        if roster is None:
            return BroadcastReport(transfer_s=0.0, **report)
        report.update(num_receivers=len(roster.slots), group_id=roster.group_id)
        report["new_group"] = roster is not self._roster
        base = None
        if self._book is not None:
            base = self._book.base_for(version, same_group=not report["new_group"])
            named = self._book.encode(named, version, base)
            report["keyframe"] = base is None
        started = time.monotonic()
        try:
            group = self._group_for(roster)
            num_tensors, num_bytes = send_buckets(
                group, named, bucket_bytes=int(self.config.bucket_mb * 2**20)
            )
            late = self._wait_for(version, "done", roster, self.config.transfer_timeout_s)
            if late:
                raise TimeoutError(f"members {sorted(late)} did not confirm round {version}")
        except (RuntimeError, TimeoutError) as e:
            # A receiver died or hung (TransferTimeout, gloo errors, DistError: all
            # RuntimeErrors): this round is lost for everyone in it, the group goes, and the
            # next round forms a fresh one of whoever is alive. The learner goes on.
            log.warning("weight round %d failed: %s", version, e)
            # Said first: a receiver still waiting on this round stops at once (rather than
            # after its own timeout) and is ready in time for the next.
            self._store.set(round_key(version, "failed"), str(e))
            self._discard_group()
            if self._book is not None:
                self._book.forget()
            report.update(transfer_s=time.monotonic() - started, error=str(e))
            return BroadcastReport(**report)
        report.update(num_tensors=num_tensors, num_bytes=num_bytes, raw_bytes=num_bytes)
        if self._book is not None:
            self._book.commit(version, base)
            report["raw_bytes"] = self._book.raw_bytes
        return BroadcastReport(transfer_s=time.monotonic() - started, **report)

    def _group_for(self, roster: Roster) -> WeightGroup:
        """The communicator of `roster`: the current one, or (membership changed) the old
        one closed and a new one formed."""
        if self._group is not None and self._roster is roster and not self._group.closed:
            return self._group
        self._discard_group()
        self._group = WeightGroup(
            self._store,
            self.config.store_host,
            roster.group_id,
            0,
            roster.world_size,
            roster.backend,
            self.config.transfer_timeout_s,
        )
        self._roster, self._broken = roster, False
        return self._group

    def _discard_group(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group, self._broken = None, True

    def _forget_before(self, version: int) -> None:
        """Delete older rounds' keys and older groups' keys, so the store does not grow."""
        current = self._roster.group_id if self._roster is not None else self._next_group_id
        for name in self._store.list_keys():
            parts = name[len(PREFIX) + 1 :].split("/")
            if len(parts) < 2 or not parts[1].isdigit():
                continue
            if (parts[0] == "round" and int(parts[1]) < version) or (
                parts[0] == "group" and int(parts[1]) < current
            ):
                self._store.delete_key(name)

    def close(self) -> None:
        """End the broadcast: close the group (synchronised), tell subscriptions."""
        self._discard_group()
        self._store.set(key("latest"), CLOSED)
        del self._store


def _gpu_uuid() -> str:
    """This process's GPU (engines must not share it: NCCL refuses two ranks on one GPU)."""
    import torch

    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
