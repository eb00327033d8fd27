"""The tiny-model demo kit: a byte-level BPE tokenizer with a tool-calling chat template,
a tiny Qwen2 with a supervised warm start (shipped in `tiny_model/`), and the calculator
task's data. Uses the env service only through its public interface (gRPC), never by
importing a role."""

from pathlib import Path

SHIPPED_MODEL_DIR = Path(__file__).resolve().parent / "tiny_model"
"""The warm-started tiny model, tokenizer and the tool specs it was trained on."""
