"""Renderer of bench/delta_sync.py: bf16 weight updates as deltas at the 0.5B shape, bytes
on the wire over the full bf16 bytes, and the codec's seconds."""

from __future__ import annotations

from bench.render.markdown import Figures, check, count, fixed, join, percent, provenance, table

RUNS = (("rl", "RL fine-tuning"), ("demo", "the demo's"))
HEADER = [
    "updates at",
    "bf16 values changed",
    "xor: bytes / full (median / max)",
    "sparse: bytes / full (median / max)",
    "xor encode / decode, s",
    "bit-exact",
    "broadcast: wire bytes / whole (median / max)",
    "broadcast: a delta round / the keyframe's, s",
    "bit-exact in the receiver",
]


def _pair(f: Figures, first: str, second: str, places: int = 3) -> str:
    return f"{fixed(f.get(first), places)} / {fixed(f.get(second), places)}"


def delta_sync(f: Figures) -> str:
    setup = (
        f"A random Qwen2 (`{f.get('model', '—')}`), {count(f.get('rl_full_bf16_mb'))} MB in"
        f" bf16; {f.get('updates', '—')} AdamW steps on random batches of"
        f" {f.get('tokens_per_batch', '—')} tokens at each learning rate; after each, the bf16"
        " version against the one before, per tensor (weights/shared/delta.py). A whole version,"
        f" zstd-compressed, is {fixed(f.get('rl_keyframe_ratio'))} of its bytes. Then the"
        " same versions through the real broadcast with `weight_sync.delta` (a keyframe,"
        " then deltas; gloo over loopback) to a receiver process rebuilding each as an"
        " engine worker does."
    )
    rows = [
        [
            f"{label} lr {f.get(f'{run}_lr', '—')}",
            percent(f.get(f"{run}_changed_fraction_median"), 1),
            _pair(f, f"{run}_xor_ratio_median", f"{run}_xor_ratio_max"),
            _pair(f, f"{run}_sparse_ratio_median", f"{run}_sparse_ratio_max"),
            _pair(f, f"{run}_xor_encode_s_median", f"{run}_xor_decode_s_median", 2),
            "yes" if f.get(f"{run}_bit_exact") else "no",
            _pair(f, f"{run}_wire_ratio_median", f"{run}_wire_ratio_max"),
            _pair(f, f"{run}_wire_transfer_s_median", f"{run}_wire_keyframe_transfer_s", 2),
            "yes" if f.get(f"{run}_wire_bit_exact") else "no",
        ]
        for run, label in RUNS
    ]
    target = check(
        "lr 1e-6, xor, bytes per update over full bf16 (the largest)",
        f.get("rl_xor_ratio_max"),
        0.05,
        "<=",
        lambda v: fixed(v, 3),
    )
    on_wire = check(
        "lr 1e-6, broadcast with weight_sync.delta, wire bytes per update over the whole"
        " version (the largest)",
        f.get("rl_wire_ratio_max"),
        0.05,
        "<=",
        lambda v: fixed(v, 3),
    )
    return join(setup, table(HEADER, rows), target, on_wire, provenance(f))
