"""Renderers that turn bench/results/<name>.json into the markdown of docs/benchmarks.md's
figures: one function per rendered block (`sections.SECTIONS`), pure functions of a flat
figures dict; bench/render_docs.py reads the files and rewrites the doc."""
