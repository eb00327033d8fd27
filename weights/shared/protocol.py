"""The contract between an actor and its engine's workers (weights/engine_side/, inside
vLLM's worker processes): the worker methods the actor calls by name through vLLM's
`collective_rpc`, what it hands them for a round (`RoundTicket`, made by the actor's
subscription), and what they answer (`LoadResult`, `StageState`). Arguments and answers
cross processes as plain dicts (`as_dict`, `from_dict`): vLLM serialises them with msgpack.
Both sides import this module; it imports neither vLLM nor the learner's side.

    actor (actors/vllm_engine.py)                    worker (weights/engine_side/vllm_worker.py)
    Worker.RECEIVE(ticket, staged, track) ─────────► LoadResult: receive and load a round
    Worker.STAGE(ticket, swap, track) ─────────────► StageState: receive in a thread
    Worker.STAGED_STATE() ─────────────────────────► StageState
    Worker.LOAD_STAGED(ticket, track) ─────────────► LoadResult: load what was staged
    Worker.DROP_STAGED()                             forget it
    Worker.LOAD_SNAPSHOT(path, track, staged) ─────► LoadResult (version 0: a snapshot)
    Worker.MERGE_SNAPSHOT(path, version, track) ───► LoadResult: an adapter, merged
    Worker.CHECKSUM() ─────────────────────────────► the last load's checksum, or None
    Worker.CLOSE()                                   leave the broadcast's group
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Self


class Wire:
    """A dataclass that crosses between the actor and its engine's workers as a plain dict
    (vLLM serialises a collective_rpc's arguments and answers with msgpack)."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Self:
        return cls(**values)


class Worker:
    """The names of the worker's methods (WeightSyncExtension), as the actor calls them."""

    RECEIVE = "receive_weights"
    STAGE = "stage_weights"
    STAGED_STATE = "staged_weights_state"
    LOAD_STAGED = "load_staged_weights"
    DROP_STAGED = "drop_staged_weights"
    LOAD_SNAPSHOT = "load_weights_from_path"
    MERGE_SNAPSHOT = "merge_adapter_from_path"
    CHECKSUM = "weights_checksum"
    CLOSE = "close_weight_channel"


@dataclass
class LoadResult(Wire):
    """What one worker's load of a round or a snapshot came to. A failure the worker
    expects (a failed round, a snapshot it cannot read, a tensor the model refuses) is
    `ok` False with its `error`, never an exception; `weights_mixed` when the load had
    begun (some layers new, some old)."""

    version: int = 0
    ok: bool = True
    error: str = ""
    weights_mixed: bool = False
    num_bytes: int = 0
    receive_s: float = 0.0
    """Forming the round's group and waiting for its buckets."""
    load_s: float = 0.0
    """The rest: loading into the model (for a staged round, the pause's load alone)."""
    wire_s: float = 0.0
    """Of `receive_s`, the round's messages' time on the wire."""
    shadow_s: float = 0.0
    """Loading a staged round into the shadow model, off the pause (0: none)."""
    adapter_path: str = ""
    """A LoRA round on an engine with vLLM's LoRA: the directory for `add_lora`."""

    def failed(self, error: str, *, mixed: bool) -> LoadResult:
        return dataclasses.replace(self, ok=False, error=error, weights_mixed=mixed)


@dataclass(frozen=True)
class StageState(Wire):
    """A staged round: received (`done`), or failed while staging (`error`)."""

    done: bool
    error: str = ""


@dataclass(frozen=True)
class RoundTicket(Wire):
    """A member's seat in round `version`: what its engine workers need to take part."""

    version: int
    group_id: int
    """The group the round is planned on (the sender may move it to a smaller one)."""
    member_id: int
    slots: int
    store_host: str
    store_port: int
    join_timeout_s: float
    transfer_timeout_s: float
    store_id: str = ""
    """The store (learner process) that planned the round: a receiver never takes part in
    it on another store, such as a restarted learner's on the same address."""
    payload: str = "full"
    """What the round carries: `full` weights, or a `lora` adapter
    (weights/formats/adapter.py)."""
    adapter_config: dict[str, Any] | None = None
    """The adapter's PEFT `adapter_config.json` (payload `lora`)."""
