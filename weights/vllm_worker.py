"""vLLM worker extension: the engine-worker half of the weight broadcast.

Passed to vLLM as `worker_extension_cls="weights.vllm_worker.WeightSyncExtension"`;
vLLM mixes it into its worker class, so these methods run inside the engine process (next
to the model) and are called from the actor with `AsyncLLM.collective_rpc(name, ...)`.
Arguments cross a process boundary, so they are plain dicts, strings and numbers.

Weights are loaded with `model_runner.reload_weights(weights_iterator=...)`, which undoes
and redoes the kernel-format processing of the loaded parameters (on CPU vLLM repacks
weights after loading, and the repacked parameters have no `weight_loader`, so a plain
`model.load_weights` after start-up fails). Received tensors are staged whole before
loading by default, so a round that fails half-way leaves the old weights intact.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from weights.receiver import receive_round
from weights.snapshot import safetensors_weights
from weights.subscription import RoundTicket


class Checksum:
    """Order-independent fingerprint of named tensors, fed one at a time: float64 sum and
    sum of squares, and counts. Equal weights give equal values up to float64 rounding."""

    def __init__(self) -> None:
        self.values = {
            "sum": 0.0,
            "sum_sq": 0.0,
            "num_tensors": 0,
            "num_elements": 0,
            "num_bytes": 0,
        }

    def add(self, tensor: torch.Tensor) -> None:
        values = tensor.detach().to(torch.float64)
        self.values["sum"] += values.sum().item()
        self.values["sum_sq"] += values.square().sum().item()
        self.values["num_tensors"] += 1
        self.values["num_elements"] += tensor.numel()
        self.values["num_bytes"] += tensor.numel() * tensor.element_size()


def checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
    fingerprint = Checksum()
    for _, tensor in named_tensors:
        fingerprint.add(tensor)
    return fingerprint.values


def tied_aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """{first name: other names} of parameters shared between modules (tied embeddings:
    `model.embed_tokens.weight` -> [`lm_head.weight`])."""
    first_name: dict[int, str] = {}
    aliases: dict[str, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical = first_name.setdefault(id(param), name)
        if canonical != name:
            aliases.setdefault(canonical, []).append(name)
    return aliases


def with_aliases(
    weights: Iterable[tuple[str, torch.Tensor]], aliases: dict[str, list[str]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Send each tied tensor under every name that shares it, and drop incoming aliases.

    Needed because an in-place reload does not keep the tie: on vLLM 0.32 (CPU) reloading
    only `model.embed_tokens.weight` (what a tied HF checkpoint or `named_parameters()`
    holds) leaves the LM head with stale weights, while loading both names is correct."""
    alias_names = {alias for names in aliases.values() for alias in names}
    for name, tensor in weights:
        if name in alias_names:
            continue  # tied: its value is the canonical tensor's
        yield name, tensor
        for alias in aliases.get(name, ()):
            yield alias, tensor


class WeightSyncExtension:
    """Methods added to vLLM's worker (`self` is the worker: `model_runner`, `vllm_config`,
    `rank` come from it). Names must not clash with the worker's own attributes."""

    def _tether_reload(self, weights: Iterable[tuple[str, torch.Tensor]], track: bool) -> int:
        """Load (name, tensor) pairs in HF checkpoint format, and with `track` remember their
        checksum (the model's own parameters cannot be summed: on CPU the linear weights
        live repacked in oneDNN handles, the parameters left empty). Returns bytes loaded."""
        from vllm.config import set_current_vllm_config

        if not hasattr(self, "_tether_aliases"):  # ties are intact until the first reload
            self._tether_aliases = tied_aliases(self.model_runner.get_model())
        fingerprint = Checksum()
        num_bytes = 0

        def recorded():
            nonlocal num_bytes
            for name, tensor in weights:
                num_bytes += tensor.numel() * tensor.element_size()
                if track:
                    fingerprint.add(tensor)
                yield name, tensor

        with set_current_vllm_config(self.vllm_config):
            self.model_runner.reload_weights(
                weights_iterator=with_aliases(recorded(), self._tether_aliases)
            )
        self._tether_checksum = fingerprint.values if track else None
        return num_bytes

    def receive_weights(
        self, ticket: dict[str, Any], staged: bool = True, track_checksum: bool = False
    ) -> dict[str, float]:
        """Join the round of `ticket` (a `RoundTicket.as_dict()`) at rank base_rank + this
        worker's rank, receive every tensor and load it. `staged=False` loads while
        receiving (no second copy of the model, but a failed round leaves weights mixed).
        `track_checksum` records `weights_checksum()` (costs a float64 pass over the
        weights)."""
        round_ticket = RoundTicket(**ticket)
        started = time.monotonic()
        weights = receive_round(round_ticket, worker_rank=self.rank)
        if staged:
            weights = [(name, tensor) for name, tensor in weights]
        received = time.monotonic()
        num_bytes = self._tether_reload(weights, track_checksum)
        loaded = time.monotonic()
        return {
            "version": round_ticket.version,
            "num_bytes": num_bytes,
            "receive_s": received - started,
            "load_s": loaded - received,
        }

    def load_weights_from_path(
        self, path: str, track_checksum: bool = False, staged: bool = True
    ) -> None:
        """Load a checkpoint directory (safetensors, HF names) saved by the learner: what a
        late joiner does before it generates, or a receiver after a failed round. `staged`
        reads every file before loading any tensor, so a snapshot that vanished or is cut
        short (the learner rotates them) leaves the old weights intact."""
        weights = safetensors_weights(path)
        if staged:
            weights = list(weights)
        self._tether_reload(weights, track_checksum)

    def weights_checksum(self) -> dict[str, float] | None:
        """`checksum` of the weights loaded last (None before, or when not tracked)."""
        return getattr(self, "_tether_checksum", None)
