"""A tokenizer with Qwen2's real vocabulary (its 151,643 byte-level BPE ranks), for benchmarks.

Random models of Qwen2-0.5B's shape sample ids from the whole 151k vocabulary; over the
tiny tokenizer (demo/tokenizer.py) most of those ids would not exist, so detokenising, tool
call parsing and the engine's output path would run on nothing like real text. No model hub
is reachable here, only PyPI, and the `dashscope` wheel ships Qwen's ranks in tiktoken format
(`dashscope/resources/qwen.tiktoken`: one `<base64 bytes> <rank>` a line). The wheel is
downloaded, never installed; the ranks are converted to a HuggingFace byte-level BPE that
encodes exactly as BPE over the ranks does (tests/demo/test_qwen_vocab.py checks it against a
plain reference), and wrapped as the demo wraps its tiny tokenizer: the same chat template,
EOS `<|im_end|>`, pad `<|endoftext|>`, with the special and added tokens right after the ranks
(ids 151643, 151644, 151645 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, as in Qwen2).

Builds go under `<cache root>/qwen-vocab-<hash>` (the hash covers the ranks file and
RECIPE_VERSION) beside the tiny model's (`demo.tinymodel.default_cache_root()`), written in a
temporary directory and renamed into place. The wheel is cached there too: only the first
build needs the network.

    python -m demo.qwen_vocab        # builds (or finds) it; prints the directory and size
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from demo.chat_template import (
    CHAT_TEMPLATE,
    END_OF_TEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TEXT_TOKENS,
)

DASHSCOPE = "dashscope==2.0.2"
WHEEL_NAME = "dashscope-2.0.2-py3-none-any.whl"
RANKS_MEMBER = "dashscope/resources/qwen.tiktoken"
RANKS_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
"""The ranks file this module was written against (a different file is refused)."""
QWEN_VOCAB_SIZE = 151_643
"""Number of BPE ranks: ids 0..151642; our special and added tokens follow."""
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenisation regex (digits one by one, letters with one leading non-letter)."""
MODEL_MAX_LENGTH = 32_768
"""Qwen2's. Not the tiny tokenizer's 2048: vLLM caps max_model_len at the tokenizer's."""
RECIPE_VERSION = 1
"""Bump when the conversion or the wrapping changes: it names a new cache entry."""


class RanksDownloadError(RuntimeError):
    """The dashscope wheel could not be downloaded from PyPI."""


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Token bytes -> rank, from a tiktoken file (ranks must be 0..n-1, each once)."""
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks must be 0..n-1, each once")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character map that byte-level BPE vocabularies are written in: printable
    ASCII and Latin-1 bytes stand for themselves, the others are shifted past U+00FF."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The HF BPE vocabulary and merges that encode as BPE over `ranks` does.

    Rank-based BPE merges, at each step, the adjacent pair whose concatenation has the lowest
    rank; HF BPE the adjacent pair listed first among the merges. So every split of a token
    into two tokens is a merge (not only the one that made it: another split can meet later),
    ordered by the merged token's rank: at each step both see the same pairs in the same order.
    """
    byte_char = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    merges = sorted(
        (rank, ranks[token[:i]], ranks[token[i:]], token[:i], token[i:])
        for token, rank in ranks.items()
        for i in range(1, len(token))
        if token[:i] in ranks and token[i:] in ranks
    )
    vocab = {text(token): rank for token, rank in ranks.items()}
    return vocab, [(text(left), text(right)) for *_, left, right in merges]


def qwen_backend(ranks: dict[bytes, int]) -> Tokenizer:
    """The byte-level BPE over `ranks` with Qwen2's pre-tokeniser, then our special tokens
    and added (text) tokens at ids len(ranks), len(ranks) + 1, ..."""
    vocab, merges = vocab_and_merges(ranks)
    # A piece that is a whole token is that token (tiktoken looks pieces up before merging).
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    return tokenizer


def wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """`backend` with the chat template, EOS and pad tokens, as `demo.tokenizer.build_tokenizer`
    wraps the tiny one (only model_max_length differs, see MODEL_MAX_LENGTH)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def download_wheel(downloads: Path) -> Path:
    """The dashscope wheel in `downloads` (fetched from PyPI by pip on the first call)."""
    wheel = downloads / WHEEL_NAME
    if wheel.is_file():
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   DASHSCOPE, "-d", scratch]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not (Path(scratch) / WHEEL_NAME).is_file():
            raise RanksDownloadError(
                f"could not download Qwen's BPE ranks: `{' '.join(command)}` exited "
                f"{done.returncode} (PyPI must be reachable; the wheel is only downloaded, "
                f"never installed):\n{(done.stdout + done.stderr)[-2000:]}"
            )
        os.replace(Path(scratch) / WHEEL_NAME, wheel)
    return wheel


def read_ranks_file(wheel: Path) -> bytes:
    """The tiktoken ranks file inside the wheel, checked against RANKS_SHA256."""
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(RANKS_MEMBER)
    if hashlib.sha256(data).hexdigest() != RANKS_SHA256:
        raise ValueError(f"{RANKS_MEMBER} in {wheel} is not the expected file (sha256 differs)")
    return data


def build_qwen_vocab_tokenizer(cache_root: Path | None = None) -> Path:
    """The directory of the saved Qwen-vocabulary tokenizer under `cache_root` (default: the
    tiny model's cache root); built only when no finished build is there (seconds)."""
    if cache_root is None:
        from demo.tinymodel import default_cache_root

        cache_root = default_cache_root()
    cache_root = Path(cache_root)
    data = read_ranks_file(download_wheel(cache_root / "downloads"))
    digest = hashlib.sha256(data + f"\nrecipe {RECIPE_VERSION}".encode()).hexdigest()[:16]
    final = cache_root / f"qwen-vocab-{digest}"
    if (final / "tokenizer.json").is_file():
        return final
    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache_root))
    try:
        wrap(qwen_backend(parse_ranks(data))).save_pretrained(scratch, save_jinja_files=False)
        try:
            os.rename(scratch, final)  # entries only ever appear whole
        except OSError:  # another process renamed its build into place first
            if not (final / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def main() -> None:
    from transformers import AutoTokenizer

    directory = build_qwen_vocab_tokenizer()
    print(directory)
    print(len(AutoTokenizer.from_pretrained(directory)))


if __name__ == "__main__":
    main()
