"""The tiny tokenizer: round trips, one token per digit, special and added tokens."""

import json

import pytest
from transformers import AutoTokenizer

from demo.chat_template import render_chat
from demo.data import DEMO_TOOLS, demonstrations
from demo.tokenizer import build_tokenizer, train_bpe


def test_vocabulary_size_and_special_ids(tiny_tokenizer):
    assert 400 <= len(tiny_tokenizer) <= 512
    ids = tiny_tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [0, 1, 2]
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.eos_token_id == 2
    assert tiny_tokenizer.pad_token == "<|endoftext|>" and tiny_tokenizer.pad_token_id == 0
    assert tiny_tokenizer.bos_token is None


@pytest.mark.parametrize(
    "text",
    [
        "What is 17 + 25?",
        "héllo wörld ✓ 日本",  # bytes never seen in training still round-trip
        "  leading spaces\n\ttabs\n\n",
        '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>',
    ],
)
def test_round_trip(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


def test_conversations_round_trip(tiny_tokenizer):
    for messages in demonstrations(20, seed=3):
        text = render_chat(messages, tools=DEMO_TOOLS)
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == text
        assert 120 < len(ids) < 260  # the tool spec makes most of it


def test_digits_are_one_token_each(tiny_tokenizer):
    ids = tiny_tokenizer.encode("9876543210", add_special_tokens=False)
    assert tiny_tokenizer.convert_ids_to_tokens(ids) == list("9876543210")
    ids = tiny_tokenizer.encode("is 1234?", add_special_tokens=False)
    assert [tiny_tokenizer.decode([i]) for i in ids][-5:] == ["1", "2", "3", "4", "?"]


def test_tags_are_single_tokens_that_decode_as_text(tiny_tokenizer):
    text = "<|im_start|>assistant\n<tool_call></tool_call><answer>7</answer><|im_end|>"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    tokens = tiny_tokenizer.convert_ids_to_tokens(ids)
    for tag in ("<tool_call>", "</tool_call>", "<answer>", "</answer>"):
        assert tokens.count(tag) == 1
    decoded = tiny_tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == "assistant\n<tool_call></tool_call><answer>7</answer>"


def test_save_and_reload_with_auto_tokenizer(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save_pretrained(tmp_path, save_jinja_files=False)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tiny_tokenizer.chat_template
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = render_chat(demonstrations(1, seed=0)[0], tools=DEMO_TOOLS)
    assert loaded.encode(text) == tiny_tokenizer.encode(text)
    assert (loaded.eos_token_id, loaded.pad_token_id) == (2, 0)


def test_training_is_deterministic():
    a, b = build_tokenizer(num_conversations=100), build_tokenizer(num_conversations=100)
    assert a.get_vocab() == b.get_vocab()


def test_too_small_vocabulary_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(["abc"], vocab_size=100)
