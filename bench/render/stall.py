"""The block of bench/update_stall.py: the generation stall per weight update, streamed
rounds against staged and swapped ones, on the demo and on a larger model."""

from __future__ import annotations

from bench.render.markdown import Figures, check, fixed, join, provenance, table

CASES = (("demo", "demo (0.9 M)"), ("28m", "28.7 M"))
MODES = ("streamed", "staged", "swapped")


def update_stall(f: Figures) -> str:
    setup = (
        "One engine decoding a batch of long requests while rounds of the real weight sender"
        " land, the three kinds of round alternating on the same engine; medians over"
        f" {f.get('rounds', '?')} rounds of each. The stall is the longest gap between two"
        " tokens over the update; the decode step the median gap before it. Staged and"
        " swapped rounds receive before the pause, while the engine generates (and swapped"
        " ones load the shadow model then too): their receive is not in their stall."
    )
    header = ["figure"] + [f"{name}, {mode}" for _, name in CASES for mode in MODES]
    rows = [
        ["requests decoding", *(fixed(f.get(f"batch_{c}"), 0) for c, _ in CASES for _ in MODES)],
        _row(f, "generation stall per update, ms", "stall_ms", 0),
        _row(f, "decode step, ms", "decode_step_ms", 1),
        _row(f, "**stall in decode steps**", "stall_in_decode_steps", 1),
        [
            "engine's account: pause / receive / load, ms",
            *(
                " / ".join(
                    fixed(f.get(f"engine_{part}_ms_{c}_{m}"), 0)
                    for part in ("pause", "receive", "load")
                )
                for c, _ in CASES
                for m in MODES
            ),
        ],
    ]
    ratios = "; ".join(
        f"{name}: staged {fixed(f.get(f'staged_vs_streamed_{c}'))},"
        f" swapped {fixed(f.get(f'swapped_vs_streamed_{c}'))}"
        for c, name in CASES
    )
    targets = "\n".join(
        [
            f"- stall / the streamed stall, same run: {ratios}",
            check(
                "stall in decode steps on the demo (swapped)",
                f.get("stall_in_decode_steps_demo_swapped"),
                2,
                "<=",
                lambda v: fixed(v, 1),
            ),
        ]
    )
    return join(setup, table(header, rows), targets, provenance(f))


def _row(f: Figures, label: str, key: str, places: int) -> list[str]:
    return [label, *(fixed(f.get(f"{key}_{c}_{m}"), places) for c, _ in CASES for m in MODES)]
