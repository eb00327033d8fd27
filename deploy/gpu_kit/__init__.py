"""The GPU kit: vLLM 0.26 and what it needs, carried to a lent GPU machine (docs/gpu.md)."""
