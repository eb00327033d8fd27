"""Markdown pieces the renderers share: number formats, tables, the target lines
("met"/"missed" computed from a value and its bound) and the provenance line of a run.
A figure a JSON lacks renders as a dash, never as a guess."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

Figures = Mapping[str, object]
MISSING = "—"


def fixed(value: object, places: int = 2) -> str:
    """`value` with `places` decimals and thousands separators; a dash when absent."""
    if not isinstance(value, int | float):
        return MISSING
    return f"{value:,.{places}f}"


def scaled(value: object, factor: float) -> float | None:
    """`value` x `factor`, or None when absent (so that it renders as a dash)."""
    return value * factor if isinstance(value, int | float) else None


def count(value: object) -> str:
    """A whole number with thousands separators."""
    return fixed(value, 0)


def millions(value: object) -> str:
    return MISSING if not isinstance(value, int | float) else f"{value / 1e6:.1f} M"


def percent(fraction: object, places: int = 0) -> str:
    if not isinstance(fraction, int | float):
        return MISSING
    return f"{fraction * 100:.{places}f}%"


def seconds(value: object, places: int = 1) -> str:
    return MISSING if not isinstance(value, int | float) else f"{fixed(value, places)} s"


def minutes(value_s: object) -> str:
    if not isinstance(value_s, int | float):
        return MISSING
    return f"{value_s / 60:.1f} min"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    assert all(len(row) == len(header) for row in rows), (header, rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def check(what: str, value: object, bound: float, op: str, show: Callable[[object], str]) -> str:
    """One target line: `what`, its value, the target, and whether the value meets it.
    `op` is one of ">=", ">", "<=", "<"."""
    met_by = {
        ">=": lambda v: v >= bound,
        ">": lambda v: v > bound,
        "<=": lambda v: v <= bound,
        "<": lambda v: v < bound,
    }[op]
    symbol = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}[op]
    if not isinstance(value, int | float):
        verdict = "not measured"
    else:
        verdict = "**met**" if met_by(value) else "**missed**"
    return f"- {what}: {show(value)} (target {symbol} {show(bound)}): {verdict}"


def provenance(figures: Figures) -> str:
    """When, where and under what load the figures were measured, from the JSON itself."""
    parts = [f"Measured {figures.get('measured_at', 'at an unrecorded time')}"]
    if figures.get("machine"):
        parts.append(f"on {figures['machine']};")  # a host's description has commas
    before, after = figures.get("load_avg_1m_before"), figures.get("load_avg_1m_after")
    if isinstance(before, int | float) and isinstance(after, int | float):
        parts.append(f"at 1-minute load average {before:.1f} before and {after:.1f} after")
    elif isinstance(figures.get("load_avg_1m"), int | float):
        parts.append(f"at 1-minute load average {figures['load_avg_1m']:.1f}")
    else:
        parts.append("(load average not recorded)")
    return "_" + " ".join(parts) + "._"


def join(*blocks: str) -> str:
    """Paragraphs of a rendered block, blank-line separated, empty ones dropped."""
    return "\n\n".join(block for block in blocks if block)
