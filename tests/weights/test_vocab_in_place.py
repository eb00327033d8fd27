"""Vocabulary layers loaded in place during vLLM's layerwise reload
(weights/engine_side/vocab_in_place.py):
vLLM's own embedding and LM-head layers (CPU packing included) under vLLM's real
`reload_weights`. The bytes saved are measured by bench/engine_update_memory.py at the 0.5B
shape; the engine tests check a whole engine's outputs after rounds."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from tests.log_capture import said_on
from weights.engine_side.vocab_in_place import NOTICES, ReloadNotices, vocab_in_place

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True)
def _notices_removed_afterwards():
    """`vocab_in_place` installs the process's filter on vLLM's loggers: other tests read them."""
    yield
    for name in ReloadNotices.LOGGERS:
        logging.getLogger(name).removeFilter(NOTICES)


VOCAB, WIDTH = 100, 32  # padded to 128 rows by vLLM


def _model(vocab: int = VOCAB):
    """vLLM's layers as Qwen2 ties them: `model.embed_tokens`, `lm_head` sharing its weight,
    and a plain linear layer loaded the usual way."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )
    from vllm.model_executor.models.utils import AutoWeightsLoader

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed_tokens = VocabParallelEmbedding(vocab, WIDTH, disable_tp=True)
            self.lm_head = ParallelLMHead(vocab, WIDTH, disable_tp=True).tie_weights(
                self.model.embed_tokens
            )
            self.proj = torch.nn.Linear(WIDTH, WIDTH)

        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(weights)

    model = Model()
    for layer in (model.model.embed_tokens, model.lm_head):
        layer.quant_method.process_weights_after_loading(layer)  # as the engine's load does
    return model


def _reload(model, weights, *, in_place: bool) -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    # What `reload_weights` reads of a config (the engine passes its whole VllmConfig).
    config = SimpleNamespace(
        model_config=SimpleNamespace(quantization=None), load_config=None, lora_config=None
    )
    with set_current_vllm_config(VllmConfig()):
        record_metadata_for_reloading(model)
        if not in_place:
            reload_weights(config, model, iter(weights), None, is_checkpoint_format=True)
            return
        with vocab_in_place(model) as loading:
            reload_weights(config, model, loading.load(weights), None, is_checkpoint_format=True)
            loading.repack()


def _said_on_reload(model, weights, *, in_place: bool) -> list[str]:
    with said_on(*ReloadNotices.LOGGERS) as said:
        _reload(model, weights, in_place=in_place)
    return said.messages


def test_the_embedding_is_written_into_the_live_tensor_and_the_tied_head_packed_again():
    torch.manual_seed(0)
    model = _model()
    embedding = model.model.embed_tokens.weight
    address, old_linear = embedding.data_ptr(), model.lm_head.cpu_linear
    new = torch.randn(VOCAB, WIDTH)
    proj = torch.randn(WIDTH, WIDTH)
    weights = [
        ("model.embed_tokens.weight", new),
        ("lm_head.weight", new),  # its alias: sent too (vllm_worker.py with_aliases)
        ("proj.weight", proj),
        ("proj.bias", torch.zeros(WIDTH)),
    ]
    said = _said_on_reload(model, weights, in_place=True)

    assert model.model.embed_tokens.weight is embedding and embedding.data_ptr() == address
    assert model.lm_head.weight is embedding  # still tied
    assert torch.equal(embedding[:VOCAB], new) and not embedding[VOCAB:].any()  # padding 0
    assert torch.equal(model.proj.weight, proj)  # the rest went through vLLM's reload
    assert model.lm_head.cpu_linear is not old_linear  # packed again, from the new weight
    x = torch.randn(3, WIDTH)
    logits = model.lm_head.quant_method.apply(model.lm_head, x)
    torch.testing.assert_close(logits[:, :VOCAB], x @ new.T, rtol=1e-5, atol=1e-5)
    assert said == []  # nothing said for the layers written in place


def test_without_it_vllm_says_so_and_with_it_other_failures_are_still_said():
    model = _model()
    said = _said_on_reload(model, [("proj.weight", torch.zeros(WIDTH, WIDTH))], in_place=True)
    assert "VocabParallelEmbedding: Failed to load weights" in said  # not loaded at all
    assert any(line.startswith("Following weights were not loaded") for line in said)


def test_a_tensor_that_does_not_fit_is_refused_by_name():
    model = _model()
    with pytest.raises(ValueError, match=r"model\.embed_tokens\.weight: a tensor of shape"):
        with vocab_in_place(model) as loading:
            list(loading.load([("model.embed_tokens.weight", torch.zeros(VOCAB + 1, WIDTH))]))


def test_a_tensor_received_into_the_live_parameter_is_loaded_where_it_is():
    """The broadcast may write a lone vocabulary-sized tensor straight into the rows
    `destination` offers (weights/shared/collective.py): only in the parameter's dtype and width,
    for the whole vocabulary; the load then finds it there, keeps the padding rows zero and
    packs the tied head again."""
    model = _model()
    embedding = model.model.embed_tokens.weight
    name = "model.embed_tokens.weight"
    with vocab_in_place(model) as loading:
        assert loading.destination(name, "bfloat16", [VOCAB, WIDTH]) is None
        assert loading.destination(name, "float32", [VOCAB + 1, WIDTH]) is None
        assert loading.destination(name, "float32", [VOCAB, WIDTH + 1]) is None
        assert loading.destination("proj.weight", "float32", [WIDTH, WIDTH]) is None
        into = loading.destination(name, "float32", [VOCAB, WIDTH])
    assert into.data_ptr() == embedding.data_ptr() and into.shape == (VOCAB, WIDTH)
    new = torch.randn(VOCAB, WIDTH)
    with torch.no_grad():
        embedding[VOCAB:] = 1.0  # stale padding: the load zeroes it
        into.copy_(new)  # what the broadcast does as the bucket arrives
    weights = [(name, into), ("lm_head.weight", into), ("proj.weight", torch.eye(WIDTH)),
               ("proj.bias", torch.zeros(WIDTH))]  # fmt: skip
    said = _said_on_reload(model, weights, in_place=True)
    assert model.model.embed_tokens.weight is embedding and model.lm_head.weight is embedding
    assert torch.equal(embedding[:VOCAB], new) and not embedding[VOCAB:].any()
    x = torch.randn(3, WIDTH)
    logits = model.lm_head.quant_method.apply(model.lm_head, x)
    torch.testing.assert_close(logits[:, :VOCAB], x @ new.T, rtol=1e-5, atol=1e-5)
    assert said == []
