"""Supervised warm start: loss masks, the shared-prefix loss, a few steps of training."""

import math

import pytest
import torch
from transformers import Qwen2ForCausalLM

from demo.chat_template import render_chat
from demo.data import DEMO_TOOLS, demonstrations
from demo.sft import (
    collate,
    encode_conversation,
    lr_at,
    masked_lm_loss,
    shared_prefix_length,
    train_sft,
)
from demo.tinymodel import DEFAULT_RECIPE, qwen2_config


def _model(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = qwen2_config(
        DEFAULT_RECIPE, vocab_size=len(tokenizer), eos_id=2, pad_id=tokenizer.pad_token_id
    )
    return Qwen2ForCausalLM(config)


def _examples(tokenizer, num, seed=0):
    return [
        encode_conversation(tokenizer, c, DEMO_TOOLS)
        for c in demonstrations(num, seed=seed, tool_fraction=0.5)
    ]


def test_loss_mask_covers_exactly_the_generated_turns(tiny_tokenizer):
    messages = demonstrations(1, seed=0, tool_fraction=1.0)[0]
    ids, mask = encode_conversation(tiny_tokenizer, messages, DEMO_TOOLS)
    assert tiny_tokenizer.decode(ids) == render_chat(messages, tools=DEMO_TOOLS)
    generated = [i for i, m in zip(ids, mask, strict=True) if m]
    expected = messages[2]["content"] + "<|im_end|>" + messages[4]["content"] + "<|im_end|>"
    assert tiny_tokenizer.decode(generated) == expected
    # The first generated token directly follows the generation prompt.
    first = mask.index(1)
    assert tiny_tokenizer.decode(ids[first - 3 : first]) == "<|im_start|>assistant\n"


def test_shared_prefix_length_by_hand():
    a = ([1, 2, 3, 4], [0, 0, 0, 1])
    b = ([1, 2, 5, 6], [0, 0, 1, 1])
    assert shared_prefix_length([a, a]) == 2  # capped: the loss token 3 needs position 2
    assert shared_prefix_length([a, b]) == 1  # b's first loss token is at index 2
    assert shared_prefix_length([([7, 8], [1, 1]), ([7, 8], [1, 1])]) == 0


def test_collate_pads_right_and_masks_labels():
    input_ids, attention, labels = collate([([5, 6, 7], [0, 1, 1]), ([8], [1])], pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert attention.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels.tolist() == [[-100, 6, 7], [8, -100, -100]]


def test_shared_prefix_loss_equals_plain_loss(tiny_tokenizer):
    model = _model(tiny_tokenizer)
    examples = _examples(tiny_tokenizer, 6)
    assert shared_prefix_length(examples) > 100  # system prompt and tool spec
    input_ids, attention, labels = collate(examples, pad_id=tiny_tokenizer.pad_token_id)
    plain = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    shared = masked_lm_loss(model, examples, pad_id=tiny_tokenizer.pad_token_id)
    assert shared.item() == pytest.approx(plain.item(), abs=1e-5)
    weight = model.model.embed_tokens.weight
    (g_plain,) = torch.autograd.grad(plain, weight)
    (g_shared,) = torch.autograd.grad(shared, weight)
    torch.testing.assert_close(g_shared, g_plain, atol=1e-5, rtol=1e-4)


def test_lr_schedule_by_hand():
    assert lr_at(0, num_steps=100, peak_lr=1.0, warmup_steps=10) == pytest.approx(0.1)
    assert lr_at(9, num_steps=100, peak_lr=1.0, warmup_steps=10) == pytest.approx(1.0)
    assert lr_at(10, num_steps=100, peak_lr=1.0, warmup_steps=10) == pytest.approx(1.0)
    assert lr_at(55, num_steps=100, peak_lr=1.0, warmup_steps=10) == pytest.approx(0.55)
    assert lr_at(100, num_steps=100, peak_lr=1.0, warmup_steps=10) == pytest.approx(0.1)


def test_a_few_steps_lower_the_loss(tiny_tokenizer):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = _model(tiny_tokenizer)
    losses = train_sft(
        model,
        _examples(tiny_tokenizer, 16),
        pad_id=tiny_tokenizer.pad_token_id,
        num_steps=30,
        batch_size=4,
        peak_lr=3e-3,
        warmup_steps=5,
    )
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert losses[0] > 5.0  # about log(vocab) at init
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0]
    assert not model.training


def test_train_sft_rejects_bad_sizes(tiny_tokenizer):
    model = _model(tiny_tokenizer)
    with pytest.raises(ValueError, match="batch_size"):
        train_sft(
            model, _examples(tiny_tokenizer, 2), pad_id=0, num_steps=1, batch_size=4, peak_lr=1e-3
        )
