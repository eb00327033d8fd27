"""LoRA training (`learner.finetune.mode = "lora"`) on one process: shared-prefix training
stays exact with the adapter (logprobs, loss and every adapter gradient equal one plain
forward per sample), only the adapter moves, checkpoints hold the adapter and its optimizer
state and resume identically, and what leaves the learner is a PEFT adapter that PEFT loads
to the same logits. The merge math is checked by hand and against PEFT's own merge."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from learner.trainer.checkpoint import TrainingState
from learner.trainer.config import FinetuneConfig
from learner.trainer.lora import adapter_config, add_lora
from learner.trainer.segment_attention import use_segment_attention
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, random_samples, tiny_qwen2
from tests.learner.segment_builders import group, max_relative_errors, reference, shared
from weights.formats.adapter import (
    ADAPTER_CONFIG,
    AdapterSnapshotWriter,
    adapted_weight,
    merged_weights,
    peft_name,
    read_adapter_dir,
    scaling,
)

FINETUNE = FinetuneConfig(
    mode="lora", rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]
)


def _lora_model(*, seed: int = 0, tied: bool = False) -> torch.nn.Module:
    """The tiny Qwen2 with an adapter whose B is random (PEFT starts B at zero, which
    would make the adapter a no-op and A's gradient zero)."""
    model = add_lora(tiny_qwen2(seed=seed, tie_word_embeddings=tied), FINETUNE)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def _lora_config(**overrides):
    return learner_config(finetune=FINETUNE.model_dump(), **overrides)


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean"])
def test_shared_prefix_training_with_lora_equals_one_forward_per_sample(reduction):
    samples = [
        *group(group_id="a", prefix_len=24, suffix_lens=[9, 1, 17, 4], seed=1),
        *group(group_id="b", prefix_len=20, prompt_len=12, suffix_lens=[12, 6], seed=2),
    ]
    plain = _lora_model(tied=True)
    segmented = _lora_model(tied=True)
    segmented.load_state_dict(plain.state_dict())
    expected = reference(plain, samples, reduction=reduction)
    got, (pieces,) = shared(use_segment_attention(segmented), samples, token_budget=512,
                            reduction=reduction)  # fmt: skip
    assert sorted(p.prefix_len for p in pieces) == [20, 24]  # both groups shared
    # Gradients only on the adapter: 2 layers x 3 modules x (A, B).
    assert len(got.grads) == 12 and all(".lora_" in name for name in got.grads)
    assert all(g.abs().max() > 0 for g in got.grads.values())
    errors = max_relative_errors(got, expected)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])


def test_a_lora_step_moves_the_adapter_only():
    model = _lora_model()
    before = _params(model)
    trainer = Trainer(model, _lora_config())
    assert trainer.lora and trainer.adapter_config["r"] == 4
    metrics = trainer.train_step(random_samples(num_samples=4, seed=3))
    assert metrics["skipped"] == 0.0 and trainer.version == 1
    after = _params(trainer.model)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved == {n for n in before if ".lora_" in n}
    # AdamW holds state for the adapter's 12 tensors, nothing for the frozen base.
    assert len(trainer.optimizer.state) == 12


def test_a_plain_model_gets_its_adapter_from_the_trainer():
    trainer = Trainer(tiny_qwen2(), _lora_config())
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert len(trainable) == 12 and all(".lora_" in n for n in trainable)
    with pytest.raises(ValueError, match="not found in the base model"):
        Trainer(tiny_qwen2(), learner_config(finetune={"mode": "lora", "target_modules": ["x"]}))


def test_lora_checkpoint_holds_the_adapter_and_resumes_identically(tmp_path):
    config = _lora_config(optim={"warmup_steps": 2})
    batch_1, batch_2 = random_samples(num_samples=4, seed=5), random_samples(num_samples=4, seed=6)
    trainer = Trainer(_lora_model(tied=True), config)
    trainer.train_step(batch_1)
    path = trainer.save(tmp_path, TrainingState(trained_ids=["a"]))
    expected = trainer.train_step(batch_2)

    keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata.keys()
    model_keys = {k for k in keys if k.startswith("model.")}
    assert len(model_keys) == 12 and all(".lora_" in k for k in model_keys)
    assert not any("base_layer" in k or "embed_tokens" in k or "lm_head" in k for k in keys)
    saved_config = json.loads((path / ADAPTER_CONFIG).read_text())
    assert (saved_config["r"], saved_config["lora_alpha"]) == (4, 8)
    assert saved_config["base_model_name_or_path"] == "unused-in-tests"

    resumed = Trainer(_lora_model(tied=True), config)  # same base; the adapter from disk
    with torch.no_grad():
        for name, param in resumed.model.named_parameters():
            if ".lora_" in name:
                param.zero_()
    resumed.load(path)
    got = resumed.train_step(batch_2)
    assert got["loss"] == expected["loss"] and got["lr"] == expected["lr"]
    after, resumed_after = _params(trainer.model), _params(resumed.model)
    assert all(torch.equal(after[n], resumed_after[n]) for n in after)


def test_full_weights_of_a_lora_run_are_the_adapter_in_peft_names(tmp_path):
    from peft import PeftModel, get_peft_model, get_peft_model_state_dict

    from learner.trainer.lora import peft_lora_config

    trainer = Trainer(_lora_model(tied=True), _lora_config())
    streamed = dict(trainer.full_weights())
    peft_model = get_peft_model(tiny_qwen2(tie_word_embeddings=True), peft_lora_config(FINETUNE))
    assert streamed.keys() == get_peft_model_state_dict(peft_model).keys()
    assert sum(t.numel() for t in streamed.values()) == 2 * (4 * 64 * 3 + 4 * 64 * 2 + 4 * 128)

    writer = AdapterSnapshotWriter(tmp_path, 1, trainer.adapter_config)
    for name, tensor in streamed.items():
        writer.add(name, tensor)
    directory = writer.finish()
    config, tensors = read_adapter_dir(directory)
    assert config == trainer.adapter_config and tensors.keys() == streamed.keys()
    loaded = PeftModel.from_pretrained(tiny_qwen2(tie_word_embeddings=True), directory).eval()
    ids = torch.tensor([[5, 17, 33, 40, 41, 99, 7]])
    with torch.no_grad():
        want = _lora_model(tied=True).eval()(input_ids=ids).logits  # the trainer's weights
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=1e-5)


def test_merge_by_hand():
    """W = I, A = [[1, 2]], B = [[1], [0]], alpha 2, r 1: W + 2 * B @ A = [[3, 4], [0, 1]]."""
    adapter = {
        "base_model.model.m.q_proj.lora_A.weight": torch.tensor([[1.0, 2.0]]),
        "base_model.model.m.q_proj.lora_B.weight": torch.tensor([[1.0], [0.0]]),
    }
    scale = scaling({"r": 1, "lora_alpha": 2})
    base = [("m.q_proj.weight", torch.eye(2)), ("m.k_proj.weight", torch.eye(2))]
    merged = dict(merged_weights(base, adapter, scale))
    assert torch.equal(merged["m.q_proj.weight"], torch.tensor([[3.0, 4.0], [0.0, 1.0]]))
    assert torch.equal(merged["m.k_proj.weight"], torch.eye(2))  # not adapted: as it was
    assert scaling({"r": 4, "lora_alpha": 8, "use_rslora": True}) == 4.0
    with pytest.raises(ValueError, match="other half"):
        dict(merged_weights(base, {k: v for k, v in adapter.items() if "lora_A" in k}, 1.0))


def test_merge_equals_peft_merge_and_unload():
    from peft import get_peft_model, set_peft_model_state_dict

    from learner.trainer.lora import peft_lora_config

    trainer = Trainer(_lora_model(), _lora_config())
    adapter = dict(trainer.full_weights())
    base = tiny_qwen2()
    merged = dict(
        merged_weights(base.state_dict().items(), adapter, scaling(trainer.adapter_config))
    )
    peft_model = get_peft_model(tiny_qwen2(), peft_lora_config(FINETUNE))
    set_peft_model_state_dict(peft_model, adapter)
    expected = peft_model.merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base.state_dict()["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip


def test_names():
    name = "model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert peft_name(name) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert adapted_weight(peft_name(name)) == ("model.layers.0.self_attn.q_proj.weight", "A")
    with pytest.raises(ValueError, match="only the adapter may train"):
        peft_name("model.layers.0.self_attn.q_proj.base_layer.bias")
    with pytest.raises(ValueError, match="not a LoRA A/B weight"):
        adapted_weight("base_model.model.model.embed_tokens.lora_embedding_A")


def test_adapter_config_is_peft_s():
    from peft import LoraConfig

    config = adapter_config(FINETUNE, "/models/base")
    assert config["target_modules"] == ["q_proj", "up_proj", "v_proj"]
    assert config["peft_type"] == "LORA" and config["inference_mode"] is True
    assert LoraConfig(**{k: v for k, v in config.items() if k != "peft_type"}).r == 4
