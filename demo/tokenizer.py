"""Train the tiny byte-level BPE tokenizer and wrap it as a transformers tokenizer.

Trained in about a second on rendered demo conversations. Digits are split one per token
before byte-level pre-tokenisation, so numbers are sequences of single-digit tokens (copying
an operand is copying tokens one by one). `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` are
special (ids 0, 1, 2); the tool/answer tags are added tokens that are single ids yet decode
as text. EOS is `<|im_end|>`, padding `<|endoftext|>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from demo.chat_template import (
    CHAT_TEMPLATE,
    END_OF_TEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TEXT_TOKENS,
    render_chat,
)
from demo.data import demonstrations

_SPLIT_ADDED = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TEXT_TOKENS))


def corpus(num_conversations: int, *, seed: int, tools: list[dict]) -> Iterator[str]:
    """Rendered demo conversations (with `tools` in their system turn), cut at special and
    added tokens (they never enter BPE)."""
    for messages in demonstrations(num_conversations, seed=seed):
        text = render_chat(messages, tools=tools)
        yield from (piece for piece in _SPLIT_ADDED.split(text) if piece)


def train_bpe(texts: Iterable[str], *, vocab_size: int) -> Tokenizer:
    """A byte-level BPE of at most `vocab_size` tokens (specials and added tokens included)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS) + len(TEXT_TOKENS):
        raise ValueError(f"vocab_size must cover the 256 bytes and the added tokens: {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TEXT_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    return tokenizer


def build_tokenizer(
    *,
    tools: list[dict] | None = None,
    vocab_size: int = 512,
    num_conversations: int = 2000,
    seed: int = 0,
) -> PreTrainedTokenizerFast:
    """Train the tiny tokenizer on demo conversations offering `tools` (default: the demo's
    tool specs) and wrap it with the chat template, EOS and pad tokens."""
    if tools is None:
        from demo.data import DEMO_TOOLS as tools
    corpus_texts = corpus(num_conversations, seed=seed, tools=tools)
    backend = train_bpe(corpus_texts, vocab_size=vocab_size)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
