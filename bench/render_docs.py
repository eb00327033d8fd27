"""Rewrite docs/benchmarks.md's figures from bench/results/*.json: the text between
`<!-- figures:NAME -->` and `<!-- /figures:NAME -->` is replaced by what the template
docs/benchmarks/NAME.md.j2 makes of its results file (bench/render/sections.py says which);
everything else is left as written. `make bench` runs this last, so the doc always shows
the latest run. `--check` writes nothing, and exits 1 naming the blocks that are not what
the results make (a results file or a template changed without rendering); a marker out of
place exits 2 whichever the mode, before anything is rendered.

    python -m bench.render_docs [--results bench/results] [--doc docs/benchmarks.md] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.render.markers import changed_blocks, check_names, replace_blocks
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a block would change"
    )
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"--results {args.results}: no such directory")
    if not args.doc.is_file():
        parser.error(f"--doc {args.doc}: no such file")
    doc = args.doc.read_text()
    try:
        check_names(doc, SECTIONS)  # before rendering: a bad marker is the doc's fault
    except ValueError as error:
        parser.exit(2, f"{args.doc}: {error}\n")
    results = load_results(args.results)
    rendered = replace_blocks(doc, render_all(results))
    if args.check:
        if stale := changed_blocks(doc, rendered):
            print(f"{args.doc} is out of date in: {', '.join(stale)}")
            print("run `python -m bench.render_docs` to rewrite it")
            sys.exit(1)
        print(f"{args.doc} is what the results make")
        return
    args.doc.write_text(rendered)
    for name, section in SECTIONS.items():
        source = f"{section.results}.json" if section.results else "constants"
        state = "" if section.results is None or section.results in results else " (missing)"
        print(f"rendered {name:<22} from {source}{state}")
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
