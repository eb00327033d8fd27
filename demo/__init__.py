"""The tiny-model demo kit: a byte-level BPE tokenizer with a tool-calling chat template,
a tiny Qwen2 with a supervised warm start, and the calculator task's data. Uses the env
service only through its public interface (gRPC), never by importing a role."""
