"""Rewrite docs/benchmarks.md's figures from bench/results/*.json: the text between
`<!-- figures:NAME -->` and `<!-- /figures:NAME -->` is replaced by what the renderer NAME
(bench/render/sections.py) makes of its results file; everything else is left as written.
`make bench` runs this last, so the doc always shows the latest run.

    python -m bench.render_docs [--results bench/results] [--doc docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.render.markers import replace_blocks
from bench.render.sections import SECTIONS, render_all

REPO = Path(__file__).resolve().parents[1]


def load_results(results_dir: Path) -> dict[str, dict]:
    """Every results file the sections read that exists, by name."""
    names = {section.results for section in SECTIONS.values() if section.results}
    return {
        name: json.loads((results_dir / f"{name}.json").read_text())
        for name in sorted(names)
        if (results_dir / f"{name}.json").exists()
    }


def render_doc(doc: str, results_dir: Path) -> str:
    return replace_blocks(doc, render_all(load_results(results_dir)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args()
    results = load_results(args.results)
    args.doc.write_text(replace_blocks(args.doc.read_text(), render_all(results)))
    for name, section in SECTIONS.items():
        source = f"{section.results}.json" if section.results else "constants"
        state = "" if section.results is None or section.results in results else " (missing)"
        print(f"rendered {name:<22} from {source}{state}")
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
