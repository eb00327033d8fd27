"""vLLM worker extension: the engine-worker half of the weight broadcast.

Passed to vLLM as `worker_extension_cls="weights.engine_side.vllm_worker.WeightSyncExtension"`;
vLLM mixes it into its worker class, so these methods run inside the engine process (next
to the model) and are called from the actor with `AsyncLLM.collective_rpc(name, ...)` by
the names in weights/shared/protocol.py (`Worker`), which also types what they answer
(`LoadResult`, `StageState`: plain dicts on the way, vLLM serialises them). What the worker
keeps between calls is one object (weights/engine_side/state.py); loading into the live
model is weights/engine_side/loading.py.

Each worker keeps one `WeightChannel` (its long-lived group) from round to round. Streamed
loads (the default) load each bucket as it arrives: the worker holds at most two buckets
(host memory on gloo, its GPU's on NCCL: the one arriving, and one whose last layer is
still being filled) and what vLLM's reload of one layer takes (the layer materialised, on
CPU also repacked), never the model; the sender is paced by the loads. A round that fails
then leaves some layers new and some old, which the result says (`weights_mixed`) so that
the engine stops generating until a whole load (the actor loads the newest snapshot at
once, actors/policy_weights.py). Staged loads (opt-in, `staged_weight_load`) copy every
tensor to host memory as its bucket arrives and load after the last: a round that fails
while receiving leaves the old weights intact, at the cost of a host copy of the model per
worker (docs/weights.md, "Memory of an update").
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

from weights.engine_side.adapter import apply_adapter
from weights.engine_side.loading import live_destination, reload, snapshot_load
from weights.engine_side.payload import load_round
from weights.engine_side.staging import RoundStaging
from weights.engine_side.state import worker_state
from weights.formats.adapter import read_adapter_dir
from weights.formats.snapshot import safetensors_weights
from weights.shared.protocol import LoadResult, RoundTicket


class WeightSyncExtension(RoundStaging):
    """Methods added to vLLM's worker (`self` is the worker: `model_runner`, `vllm_config`,
    `rank` come from it). Names must not clash with the worker's own attributes; the state
    is one attribute (`worker_state`)."""

    def receive_weights(
        self, ticket: dict[str, Any], staged: bool = False, track_checksum: bool = False
    ) -> dict[str, Any]:
        """Take part in the round of `ticket` (a `RoundTicket.as_dict()`) on this worker's
        long-lived group, receive every tensor and load it (streamed: each bucket as it
        arrives; `staged`: all of them after the last). A `LoadResult`, as a dict; never
        raises for a failed round."""
        round_ticket = RoundTicket.from_dict(ticket)
        state = worker_state(self)
        started = time.monotonic()
        state.load_started = False
        into_live = None if staged else live_destination(self)
        channel_stream = state.channel().receive(round_ticket, into_live)
        receive_s = 0.0

        def received():
            nonlocal receive_s
            while True:
                waiting = time.monotonic()
                try:
                    item = next(channel_stream)
                except StopIteration:
                    return
                finally:
                    receive_s += time.monotonic() - waiting
                yield item

        weights: Iterable[tuple[str, torch.Tensor]] = received()
        try:
            if staged:
                # Host copies as buckets arrive: the GPU never holds the model outside vLLM.
                weights = [(name, tensor.cpu()) for name, tensor in weights]
            result = load_round(self, round_ticket, weights, track_checksum)
        except (RuntimeError, TimeoutError, ValueError) as e:
            # The round failed (a peer died, the learner went away, we were not seated) or
            # the model refused a tensor: leave the round's group if we are still in it, and
            # report; the engine resumes (old weights) or stays paused (mixed).
            channel_stream.close()
            failed = LoadResult(version=round_ticket.version)
            return failed.failed(f"{type(e).__name__}: {e}", mixed=state.load_started).as_dict()
        result.receive_s, result.wire_s = receive_s, state.channel().wire_s
        result.load_s = time.monotonic() - started - receive_s
        return result.as_dict()

    def close_weight_channel(self) -> None:
        """Leave the broadcast's group cleanly (the engine is shutting down)."""
        state = worker_state(self)
        if state.weight_channel is not None:
            state.weight_channel.shutdown()
        if state.adapter_dirs is not None:
            state.adapter_dirs.remove()

    def load_weights_from_path(
        self, path: str, track_checksum: bool = False, staged: bool = False
    ) -> dict[str, Any]:
        """Load a checkpoint directory (safetensors, HF names) saved by the learner: what a
        late joiner does before it generates, or a receiver after a failed round. Files are
        loaded one at a time (host memory for one file, not the model); `staged` reads
        every file before loading any tensor. A `LoadResult` (loading.snapshot_load)."""

        def load() -> None:
            weights = safetensors_weights(path)
            if staged:
                weights = list(weights)
            reload(self, weights, track_checksum)

        return snapshot_load(self, load).as_dict()

    def merge_adapter_from_path(
        self, path: str, version: int, track_checksum: bool = False
    ) -> dict[str, Any]:
        """Merge an adapter snapshot (a PEFT directory) into the base weights and load them:
        a late joiner of a LoRA run on an engine without vLLM's LoRA (an engine with it
        loads the directory with `add_lora` instead). The adapter is read whole first: one
        that vanished or is cut short leaves the weights as they were. A `LoadResult`."""

        def merge() -> None:
            adapter_config, adapter = read_adapter_dir(path)
            apply_adapter(
                self, adapter.items(), adapter_config, version=version, track=track_checksum
            )

        return snapshot_load(self, merge).as_dict()

    def weights_checksum(self) -> dict[str, float] | None:
        """`checksum` of the weights loaded last (None before, or when not tracked)."""
        return worker_state(self).checksum
