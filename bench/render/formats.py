"""The formats the block templates of docs/benchmarks/ write figures with, as Jinja filters
and globals: numbers (`fixed`, `count`, `millions`, `percent`, `minutes`, `times`; `show`
names one in an argument), the target line (`check`: met or missed, computed from a value
and its bound), the provenance line of a run, and two ways to pick figures out of a flat
results file (`matches`, `prefixed`). A figure a results file lacks renders as a dash,
never as a guess."""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping

import jinja2

Figures = Mapping[str, object]
MISSING = "—"


class Missing(jinja2.Undefined):
    """A figure the results file lacks: shown as a dash, and still missing after arithmetic
    (a ratio of a missing figure is missing, not an error)."""

    def __str__(self) -> str:
        return MISSING

    def _stays_missing(self, *_: object) -> Missing:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _stays_missing
    __truediv__ = __rtruediv__ = __neg__ = _stays_missing


def numbers(*values: object) -> bool:
    """Whether every value is a figure that was measured (a number, not missing)."""
    return all(isinstance(value, int | float) for value in values)


def fixed(value: object, places: int = 2) -> str:
    """`value` with `places` decimals and thousands separators."""
    return f"{value:,.{places}f}" if numbers(value) else MISSING


def count(value: object) -> str:
    """A whole number with thousands separators (replaces Jinja's own `count`, an alias of
    `length` no template needs)."""
    return fixed(value, 0)


def millions(value: object) -> str:
    return f"{value / 1e6:.1f} M" if numbers(value) else MISSING


def percent(fraction: object, places: int = 0) -> str:
    return f"{fraction * 100:.{places}f}%" if numbers(fraction) else MISSING


def minutes(value_s: object, places: int = 1) -> str:
    return f"{fixed(value_s / 60, places)} min" if numbers(value_s) else MISSING


def times(value: object, places: int = 2) -> str:
    """A multiple: `3.20x`."""
    return f"{fixed(value, places)}x" if numbers(value) else MISSING


FILTERS = {format.__name__: format for format in (fixed, count, millions, percent, minutes, times)}


def show(value: object, fmt: str = "fixed", *args: object) -> str:
    """`value` written with the filter named `fmt` (given `args`): for macros and target
    lines that take the format as an argument."""
    return FILTERS[fmt](value, *args)


FILTERS["show"] = show
OPERATORS = {">=": ("≥", operator.ge), ">": (">", operator.gt),
             "<=": ("≤", operator.le), "<": ("<", operator.lt)}  # fmt: skip


def check(
    what: str, value: object, bound: float, op: str, fmt: str = "fixed", *args, unit: str = ""
) -> str:
    """One target line: `what`, its value, the target, and whether the value meets it. `op`
    is one of ">=", ">", "<=", "<"; value and bound are written with the filter named `fmt`
    (given `args`), then `unit`."""
    symbol, meets = OPERATORS[op]

    def shown(number: object) -> str:
        return show(number, fmt, *args) + unit

    if not numbers(value):
        verdict = "not measured"
    else:
        verdict = "**met**" if meets(value, bound) else "**missed**"
    return f"- {what}: {shown(value)} (target {symbol} {shown(bound)}): {verdict}"


def provenance(figures: Figures) -> str:
    """When, where and under what load the figures were measured, from the results file."""
    parts = [f"Measured {figures.get('measured_at', 'at an unrecorded time')}"]
    if figures.get("commit"):
        parts.append(f"from commit {figures['commit']}")
    if figures.get("machine"):
        parts.append(f"on {figures['machine']};")  # a host's description has commas
    before, after = figures.get("load_avg_1m_before"), figures.get("load_avg_1m_after")
    if numbers(before) and numbers(after):
        parts.append(f"at 1-minute load average {before:.1f} before and {after:.1f} after")
    elif numbers(figures.get("load_avg_1m")):
        parts.append(f"at 1-minute load average {figures['load_avg_1m']:.1f}")
    else:
        parts.append("(load average not recorded)")
    return "_" + " ".join(parts) + "._"


def matches(figures: Figures, pattern: str) -> list:
    """The first group of `pattern` over the figures' names that match it whole, each once,
    sorted; as numbers where they all are (`steps_per_s_([0-9]+)` gives the sessions)."""
    found = {m.group(1) for name in figures if (m := re.fullmatch(pattern, name))}
    if all(value.isdigit() for value in found):
        return sorted(int(value) for value in found)
    return sorted(found)


def prefixed(figures: Figures, prefix: str) -> dict[str, object]:
    """The figures whose names start with `prefix`, by the rest of their names."""
    return {name[len(prefix) :]: v for name, v in figures.items() if name.startswith(prefix)}


GLOBALS = {"check": check, "provenance": provenance, "matches": matches, "prefixed": prefixed}
