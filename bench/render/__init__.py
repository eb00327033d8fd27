"""What renders docs/benchmarks.md's figures: the Jinja filters the block templates of
docs/benchmarks/ format with (formats.py), the blocks and the figures each computes from its
results file (sections.py and the small pure modules it names), and the markers that bound a
block in the doc (markers.py). bench/render_docs.py reads the files and rewrites the doc."""
