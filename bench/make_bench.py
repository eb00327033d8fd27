"""Turn `make bench`'s timing log into bench/results/make_bench.json.

The Makefile's `bench` loop appends one line per script, `NAME SECONDS LOAD_BEFORE
LOAD_AFTER` (wall seconds, and the 1-minute load average from /proc/loadavg before and after
it), then calls this with the log's path. The figures: `scripts` (the names, in order),
`<name>_s`, `<name>_load_avg_1m_before` / `_after`, `total_s`, and the load before the first
script and after the last (`load_avg_1m_before` / `_after`).

    python -m bench.make_bench LOG
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import write_results


def summarise(lines: list[str]) -> dict[str, float | str]:
    """The figures of make_bench.json from the log's lines (blank lines skipped)."""
    rows = [line.split() for line in lines if line.strip()]
    if not rows:
        raise ValueError("the timing log has no lines: did any benchmark run?")
    figures: dict[str, float | str] = {"scripts": " ".join(row[0] for row in rows)}
    for row in rows:
        if len(row) != 4:
            raise ValueError(f"expected 'NAME SECONDS LOAD_BEFORE LOAD_AFTER', got {row}")
        name, wall_s, before, after = row[0], *map(float, row[1:])
        figures[f"{name}_s"] = wall_s
        figures[f"{name}_load_avg_1m_before"] = before
        figures[f"{name}_load_avg_1m_after"] = after
    figures["total_s"] = sum(float(row[1]) for row in rows)
    figures["load_avg_1m_before"] = float(rows[0][2])
    figures["load_avg_1m_after"] = float(rows[-1][3])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    args = parser.parse_args()
    write_results("make_bench", summarise(args.log.read_text().splitlines()))


if __name__ == "__main__":
    main()
