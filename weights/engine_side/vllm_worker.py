"""vLLM worker extension: the engine-worker half of the weight broadcast.

Passed to vLLM as `worker_extension_cls="weights.engine_side.vllm_worker.WeightSyncExtension"`;
vLLM mixes it into its worker class, so these methods run inside the engine process (next
to the model) and are called from the actor with `AsyncLLM.collective_rpc(name, ...)`.
Arguments cross a process boundary, so they are plain dicts, strings and numbers.

Weights are loaded with `model_runner.reload_weights(weights_iterator=...)`, which undoes
and redoes the kernel-format processing of the loaded parameters (on CPU vLLM repacks
weights after loading, and the repacked parameters have no `weight_loader`, so a plain
`model.load_weights` after start-up fails). It processes layer by layer as their tensors
arrive (vLLM's layerwise reload), so a streamed round never needs the model twice on the GPU.

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
from collections.abc import Callable, Iterable
from typing import Any

import torch
from safetensors import SafetensorError

from weights.engine_side.adapter import apply_adapter
from weights.engine_side.cpu_packing import (
    drop_embedding_copies,
    drop_lm_head_copies,
    dropping_embedding_copies,
)
from weights.engine_side.receiver import WeightChannel
from weights.engine_side.staging import RoundStaging
from weights.engine_side.vocab_in_place import vocab_in_place
from weights.formats.adapter import read_adapter_dir
from weights.formats.snapshot import safetensors_weights
from weights.shared.protocol import RoundTicket
from weights.shared.tensors import Checksum, tied_aliases, with_aliases


class WeightSyncExtension(RoundStaging):
    """Methods added to vLLM's worker (`self` is the worker: `model_runner`, `vllm_config`,
    `rank` come from it). Names must not clash with the worker's own attributes."""

    def _tether_reload(self, weights: Iterable[tuple[str, torch.Tensor]], track: bool) -> int:
        """Load (name, tensor) pairs in HF checkpoint format, and with `track` remember their
        checksum (the model's own parameters cannot be summed: on CPU the linear weights
        live repacked in oneDNN handles, the parameters left empty). Returns bytes loaded.
        A load cut short (its source failed, or the model refused a tensor) is finalised
        (layers not reached keep their old weights, no layer is left on the meta device)
        before the error goes on; `_tether_load_started` then says whether any tensor
        reached the model (the weights are mixed)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.get_model()
        if not hasattr(self, "_tether_aliases"):  # ties are intact until the first reload
            self._tether_aliases = tied_aliases(model)
        fingerprint = Checksum()
        num_bytes = 0

        def recorded():
            nonlocal num_bytes
            for index, (name, tensor) in enumerate(weights):
                if index == 0:  # its reload packs it again (cpu_packing)
                    drop_lm_head_copies(model)
                self._tether_load_started = True
                num_bytes += tensor.numel() * tensor.element_size()
                if track:
                    fingerprint.add(tensor)
                yield name, tensor

        with set_current_vllm_config(self.vllm_config), vocab_in_place(model) as in_place:
            self._tether_in_place = in_place
            try:
                self.model_runner.reload_weights(
                    weights_iterator=dropping_embedding_copies(
                        model, in_place.load(with_aliases(recorded(), self._tether_aliases))
                    )
                )
                in_place.repack()
            except BaseException:  # whatever stopped it: no layer may stay on the meta device
                finalize_layerwise_reload(model, self.vllm_config.model_config)
                raise
            finally:
                self._tether_in_place = None
                drop_embedding_copies(model)  # one packed late (finalize) or before any round
        self._tether_checksum = fingerprint.values if track else None
        return num_bytes

    def _tether_load_round(
        self, ticket: RoundTicket, weights: Iterable[tuple[str, torch.Tensor]], track: bool
    ) -> dict[str, Any]:
        """Load a round's tensors: full weights, or an adapter (vLLM's LoRA, or merged)."""
        if ticket.payload == "lora":
            return apply_adapter(
                self, weights, ticket.adapter_config, version=ticket.version, track=track
            )
        return {"num_bytes": self._tether_reload(weights, track)}

    def _tether_live_destination(self, name: str, dtype: str, shape: list) -> torch.Tensor | None:
        """Where a streamed round's lone tensor may arrive: straight into the live model's
        vocabulary layer of that name (`VocabInPlace.destination`) while a reload runs. The
        load has begun once one is handed out: a round failing mid-tensor leaves it mixed."""
        in_place = getattr(self, "_tether_in_place", None)
        target = None if in_place is None else in_place.destination(name, dtype, shape)
        if target is not None:
            self._tether_load_started = True
        return target

    def _tether_channel(self) -> WeightChannel:
        if not hasattr(self, "_tether_weight_channel"):
            self._tether_weight_channel = WeightChannel(worker_rank=self.rank)
        return self._tether_weight_channel

    def receive_weights(
        self, ticket: dict[str, Any], staged: bool = False, track_checksum: bool = False
    ) -> dict[str, Any]:
        """Take part in the round of `ticket` (a `RoundTicket.as_dict()`) on this worker's
        long-lived group, receive every tensor and load it (streamed: each bucket as it
        arrives; `staged`: all of them after the last). Never raises for a failed round: `ok`
        False, `error`, and `weights_mixed` when the load had begun. `track_checksum`
        records `weights_checksum()`. `receive_s` is the time spent receiving (forming the
        group, waiting for buckets), `load_s` the rest; `wire_s`, of `receive_s`, the time
        the round's messages took to arrive."""
        round_ticket = RoundTicket(**ticket)
        started = time.monotonic()
        self._tether_load_started = False
        into_live = None if staged else self._tether_live_destination
        channel_stream = self._tether_channel().receive(round_ticket, into_live)
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
        result: dict[str, Any] = {"version": round_ticket.version, "ok": True, "error": ""}
        try:
            if staged:
                # Host copies as buckets arrive: the GPU never holds the model outside vLLM.
                weights = [(name, tensor.cpu()) for name, tensor in weights]
            result.update(self._tether_load_round(round_ticket, weights, track_checksum))
        except (RuntimeError, TimeoutError, ValueError) as e:
            # The round failed (a peer died, the learner went away, we were not seated) or
            # the model refused a tensor: leave the round's group if we are still in it, and
            # report; the engine resumes (old weights) or stays paused (mixed).
            channel_stream.close()
            result.update(
                ok=False, error=f"{type(e).__name__}: {e}", weights_mixed=self._tether_load_started
            )
            return result
        elapsed = time.monotonic() - started
        wire_s = self._tether_channel().wire_s
        result.update(
            receive_s=receive_s, load_s=elapsed - receive_s, wire_s=wire_s, weights_mixed=False
        )
        return result

    def close_weight_channel(self) -> None:
        """Leave the broadcast's group cleanly (the engine is shutting down)."""
        if hasattr(self, "_tether_weight_channel"):
            self._tether_weight_channel.shutdown()
        if hasattr(self, "_tether_adapter_dirs"):
            self._tether_adapter_dirs.remove()

    def load_weights_from_path(
        self, path: str, track_checksum: bool = False, staged: bool = False
    ) -> dict[str, Any]:
        """Load a checkpoint directory (safetensors, HF names) saved by the learner: what a
        late joiner does before it generates, or a receiver after a failed round. Files are
        loaded one at a time (host memory for one file, not the model); `staged` reads
        every file before loading any tensor. Reports like `_tether_snapshot_load`."""

        def load() -> None:
            weights = safetensors_weights(path)
            if staged:
                weights = list(weights)
            self._tether_reload(weights, track_checksum)

        return self._tether_snapshot_load(load)

    def merge_adapter_from_path(
        self, path: str, version: int, track_checksum: bool = False
    ) -> dict[str, Any]:
        """Merge an adapter snapshot (a PEFT directory) into the base weights and load them:
        a late joiner of a LoRA run on an engine without vLLM's LoRA (an engine with it
        loads the directory with `add_lora` instead). The adapter is read whole first: one
        that vanished or is cut short leaves the weights as they were. Reports like
        `_tether_snapshot_load`."""

        def merge() -> None:
            adapter_config, adapter = read_adapter_dir(path)
            apply_adapter(
                self, adapter.items(), adapter_config, version=version, track=track_checksum
            )

        return self._tether_snapshot_load(merge)

    def _tether_snapshot_load(self, load: Callable[[], None]) -> dict[str, Any]:
        """Run a snapshot load. Never raises for a snapshot that cannot be read (it vanished
        or is cut short: the learner rotates them) or that the model refuses: `ok` False,
        `error`, and `weights_mixed` when the load had begun."""
        self._tether_load_started = False
        try:
            load()
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            error = f"{type(e).__name__}: {e}"
            return {"ok": False, "error": error, "weights_mixed": self._tether_load_started}
        return {"ok": True, "error": "", "weights_mixed": False}

    def weights_checksum(self) -> dict[str, float] | None:
        """`checksum` of the weights loaded last (None before, or when not tracked)."""
        return getattr(self, "_tether_checksum", None)
