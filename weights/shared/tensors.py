"""Helpers over named tensors that every side of the weight path uses, importing neither vLLM
nor FSDP: an order-independent checksum (what a round loaded, compared with what was sent),
and tied parameters (an embedding shared with the LM head) named under all their names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


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
