"""Vocabulary-sized layers loaded in place during a weight update, so that an update's host
memory is bounded by two buckets (docs/weights.md, "Memory of an update").

vLLM's layerwise reload (weights/engine_side/vllm_worker.py) buffers each layer's incoming tensors,
then
materialises the layer beside the live one, loads it, processes it and copies the result
back. For an embedding or LM head that is a second vocabulary-sized tensor (519 MB of fp32 at
Qwen2-0.5B's shape, and the largest bucket of the round is that same tensor) held while its
bucket is still alive: the update's peak was exactly its bucket plus the layer. An
unquantized embedding needs none of it: its processing (on CPU, a packed copy for the LM
head's matrix products) is a function of the weight alone. So its tensors are copied by the
layer's own `weight_loader` (its vocabulary shard, padding rows zeroed) straight into the live
parameter, which the reload holds aside and puts back unchanged at the end, and the bucket can
go at once. The LM heads written are packed again after the reload (`repack`), when no bucket
is left; their old copies went when the round started (weights/engine_side/cpu_packing.py).

Only exact names of unquantized vocabulary layers are taken (`model.embed_tokens.weight`,
`lm_head.weight`); anything else (renamed checkpoints, quantized or LoRA-wrapped layers) goes
through vLLM's reload as before. Tied heads share the embedding's parameter: one copy serves
both. vLLM's reload then says each such layer "Failed to load weights", and names them among
"weights not loaded": `ReloadNotices` drops exactly those lines, and says every other."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


class VocabInPlace:
    """The unquantized vocabulary layers of `model`, found before its reload puts them on the
    meta device: their names, and the live parameters the reload will put back."""

    def __init__(self, model: torch.nn.Module) -> None:
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )

        self.targets: dict[str, tuple[torch.nn.Module, torch.nn.Parameter]] = {}
        for module_name, module in model.named_modules():
            if isinstance(module, VocabParallelEmbedding) and isinstance(
                getattr(module, "quant_method", None), UnquantizedEmbeddingMethod
            ):
                for param_name, param in module.named_parameters(recurse=False):
                    self.targets[f"{module_name}.{param_name}"] = (module, param)
        self.written: set[str] = set()
        """Names loaded in place by the last `load` (the tied ones included)."""

    def destination(self, name: str, dtype: str, shape: list) -> torch.Tensor | None:
        """Where a tensor of `name` can be received straight into the live parameter: its
        first rows, when this layer holds the whole vocabulary (one shard, nothing added)
        in the tensor's dtype and width (vLLM's padding rows after them stay zero); else
        None (the tensor is copied as it passes)."""
        target = self.targets.get(name)
        if target is None or not shape:
            return None
        module, param = target
        shard = module.shard_indices
        whole = (
            getattr(param, "output_dim", None) == 0
            and getattr(param, "packed_dim", None) is None
            and shard.org_vocab_start_index == 0
            and shard.org_vocab_end_index == shape[0] <= param.shape[0]
            and shard.num_added_elements == 0
        )
        if not whole or param.dtype != getattr(torch, dtype, None):
            return None
        if list(param.shape[1:]) != list(shape[1:]):
            return None
        return param.data[: shape[0]]

    def load(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights` less the vocabulary layers' tensors, which are copied into the live
        parameters as they pass (each shared parameter once; one received straight into its
        parameter, `destination`, is there already)."""
        self.written = set()
        copied: set[int] = set()
        for name, tensor in weights:
            target = self.targets.get(name)
            if target is None:
                yield name, tensor
                continue
            module, param = target
            if tensor.data_ptr() == param.data_ptr() and tensor.shape[1:] == param.shape[1:]:
                param.data[tensor.shape[0] :].zero_()  # received in place: padding rows zero
                copied.add(id(param))
            if id(param) not in copied:
                _copy_in(module, param, name, tensor)
                copied.add(id(param))
            self.written.add(name)

    def repack(self) -> int:
        """Process the LM heads written again (on CPU: their packed copy for the matrix
        products; nothing elsewhere); returns how many."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        heads = {id(m): m for n, (m, _) in self.targets.items() if n in self.written}
        repacked = 0
        for module in heads.values():
            if isinstance(module, ParallelLMHead):
                module.quant_method.process_weights_after_loading(module)
                repacked += 1
        return repacked

    def layer_classes(self) -> set[str]:
        """Class names of the layers the last `load` wrote (what vLLM's notices name)."""
        return {type(self.targets[name][0]).__name__ for name in self.written}


@torch.no_grad()
def _copy_in(module, param: torch.nn.Parameter, name: str, tensor: torch.Tensor) -> None:
    try:
        module.weight_loader(param, tensor)
    except (AssertionError, RuntimeError) as e:  # vLLM's loader asserts the vocabulary size
        raise ValueError(
            f"{name}: a tensor of shape {tuple(tensor.shape)} does not fit the engine's "
            f"{tuple(param.shape)} ({type(e).__name__}: {e})"
        ) from e


class ReloadNotices(logging.Filter):
    """Drops the lines vLLM's layerwise reload says at every update for what it did not load
    and need not: the rotary cos/sin cache (a non-persistent buffer computed from the config,
    which no checkpoint holds; vLLM puts the cache it had back, unchanged: docs/actors.md), and
    the layers that a load in progress (`watching`) wrote in place. Every other layer's
    failure is still said: FoPE's rotary, say, has trained parameters."""

    LOGGERS = (
        "vllm.model_executor.model_loader.reload.layerwise",
        "vllm.model_executor.model_loader.reload.inplace",
    )

    def __init__(self) -> None:
        super().__init__()
        self.watching: set[VocabInPlace] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == "%s: Failed to load weights" and len(args) == 1:
            quiet = {"RotaryEmbedding"}.union(*(w.layer_classes() for w in self.watching))
            return args[0] not in quiet
        if str(record.msg).startswith("Following weights were not loaded") and len(args) == 1:
            written = set().union(*(w.written for w in self.watching))
            return not (isinstance(args[0], set) and args[0] <= written)
        return True

    def install(self) -> ReloadNotices:
        """Filter vLLM's reload loggers (once per process)."""
        for name in self.LOGGERS:
            if self not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(self)
        return self


NOTICES = ReloadNotices()
"""The engine process's filter: the live model's loads and the shadow's (shadow.py)."""


@contextmanager
def vocab_in_place(model: torch.nn.Module) -> Iterator[VocabInPlace]:
    """A `VocabInPlace` of `model` for one reload, its notices quiet meanwhile: pass the
    weights through its `load`, and `repack` once the reload has finished."""
    in_place = VocabInPlace(model)
    NOTICES.install().watching.add(in_place)
    try:
        yield in_place
    finally:
        NOTICES.watching.discard(in_place)
