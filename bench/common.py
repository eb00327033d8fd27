"""Shared helpers of the benchmark scripts: print a table, write bench/results/<name>.json."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"


def print_table(title: str, rows: list[tuple[str, object]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n{title}\n" + "-" * (width + 24))
    for name, value in rows:
        shown = f"{value:,.3f}" if isinstance(value, float) else f"{value}"
        print(f"{name:<{width}}  {shown:>20}")


def write_results(name: str, figures: dict[str, float | int | str]) -> Path:
    """Write a flat object of named figures plus when and where they were measured."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    record = dict(figures)
    record["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record["machine"] = f"{platform.machine()} {platform.processor() or ''}".strip()
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {path}")
    return path
