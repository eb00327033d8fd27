"""The vocabulary-sized packed copies vLLM-CPU keeps, and the two it need not keep during a
weight update, so that an update's host memory is bounded by two buckets.

On CPU vLLM multiplies by a weight through a packed copy of it (oneDNN, or sgl's format),
made by `process_weights_after_loading` and held in the layer's `cpu_linear` closure. The
embedding and the LM head share one quant method, so the embedding gets a packed copy too,
although an embedding is only looked up (`F.embedding` on its weight) and its copy is never
read: at Qwen2-0.5B's shape that is 519 MB (fp32) of dead memory, in every CPU engine.
During an update each vocabulary-sized layer is reloaded as a whole: its bucket, the layer
materialised, and a new packed copy, beside the old copy. Dropping the embedding's copy as
soon as vLLM makes it, and the LM head's old copy when a round starts (generation is paused
then; the LM head multiplies through `F.linear` on its weight until its reload packs it
again, the same numbers more slowly, also after a round that fails before reaching it),
bounds the update to two vocabulary-sized tensors beyond what the engine held before.
Linear layers proper keep their copies: vLLM frees their weights (`remove_weight`), so the
copy is all they have. GPU engines have no packed copies; these are no-ops there."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")


def _vocab_layers(model: torch.nn.Module, *, lm_heads: bool) -> Iterator[torch.nn.Module]:
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and (
            isinstance(module, ParallelLMHead) == lm_heads
        ):
            yield module


def _unpack(layers: Iterable[torch.nn.Module]) -> int:
    """Replace each layer's packed `cpu_linear` by `F.linear` on its weight; how many."""
    dropped = 0
    for layer in layers:
        if (
            getattr(layer, "cpu_linear", torch.nn.functional.linear)
            is not torch.nn.functional.linear
        ):
            layer.cpu_linear = torch.nn.functional.linear  # the closure, and its copy, go
            dropped += 1
    return dropped


def drop_embedding_copies(model: torch.nn.Module) -> int:
    """Drop the packed copies of embeddings (never read); returns how many there were."""
    return _unpack(_vocab_layers(model, lm_heads=False))


def drop_lm_head_copies(model: torch.nn.Module) -> int:
    """Drop the LM heads' packed copies (the head then computes with `F.linear`)."""
    return _unpack(_vocab_layers(model, lm_heads=True))


def dropping_embedding_copies(model: torch.nn.Module, weights: Iterable[T]) -> Iterator[T]:
    """`weights`, dropping any embedding copy each time the loader asks for the next item:
    the item before it is loaded, and a layer it completed was packed by then. The layers
    are found once: walking the model's modules per tensor was a quarter of a small
    model's reload (13 of 47 ms on the demo)."""
    embeddings = list(_vocab_layers(model, lm_heads=False))
    for item in weights:
        yield item
        _unpack(embeddings)
    _unpack(embeddings)
