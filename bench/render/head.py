"""Renderer of bench/head_memory.py: the language-model head's peak memory, plain against
chunked, at a real vocabulary."""

from __future__ import annotations

from bench.render.markdown import Figures, check, count, fixed, join, provenance, table


def head_memory(f: Figures) -> str:
    setup = (
        f"The head alone: {count(f.get('rows'))} hidden rows of {f.get('hidden', '—')} under a"
        f" {count(f.get('vocab'))}-token vocabulary, float32 on CPU, one forward and backward"
        " of each loss token's logprob and the entropy (with its gradient); peak resident"
        " memory above what the rows and the weight hold, the weight's gradient"
        f" ({count(f.get('weight_grad_mb'))} MB) included. The plain head is measured at fewer"
        " rows (it grows linearly with them) and extrapolated."
    )
    plain_rows = sorted(
        int(key.split("_")[1]) for key in f if key.startswith("plain_") and key.endswith("_rows_mb")
    )
    rows = [
        [f"plain, {n:,} rows (measured)", count(f.get(f"plain_{n}_rows_mb"))] for n in plain_rows
    ]
    rows.append([f"plain, {count(f.get('rows'))} rows (extrapolated)",
                 count(f.get("plain_extrapolated_mb"))])  # fmt: skip
    rows.append([f"chunked ({fixed(f.get('chunk_mb'), 0)} MB), {count(f.get('rows'))} rows",
                 count(f.get("chunked_mb"))])  # fmt: skip
    target = check(
        "chunked head's peak at the rows above, GB",
        None if f.get("chunked_mb") is None else f["chunked_mb"] / 1024,
        1.5,
        "<",
        fixed,
    )
    return join(setup, table(["head", "peak growth, MB"], rows), target, provenance(f))
