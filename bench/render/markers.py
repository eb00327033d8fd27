"""The rendered blocks of a doc: the text between `<!-- figures:NAME -->` and
`<!-- /figures:NAME -->` belongs to the section NAME (its template,
docs/benchmarks/NAME.md.j2) and is replaced whole. Markers are checked strictly: every block
opened and closed once, in order, and the set of names equal to the set of sections, so a
typo or a forgotten section is an error, not a stale block."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

MARKER = re.compile(r"<!-- (/?)figures:([\w-]+) -->")


def blocks(doc: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of each block's content, in order; a ValueError names the first
    marker out of place."""
    found, opened = [], None
    for match in MARKER.finditer(doc):
        closing, name = match.group(1) == "/", match.group(2)
        if not closing:
            if opened is not None:
                raise ValueError(f"figures:{name} opens inside figures:{opened[0]}")
            opened = (name, match.end())
            continue
        if opened is None or opened[0] != name:
            raise ValueError(f"/figures:{name} closes a block that is not open")
        found.append((name, opened[1], match.start()))
        opened = None
    if opened is not None:
        raise ValueError(f"figures:{opened[0]} is never closed (missing <!-- /figures:... -->)")
    names = [name for name, _, _ in found]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"blocks appear more than once: {duplicates}")
    return found


def check_names(doc: str, known: Collection[str]) -> None:
    """Every marker names a section and every section has its marker."""
    names = {name for name, _, _ in blocks(doc)}
    if unknown := sorted(names - set(known)):
        raise ValueError(f"unknown figures markers (no section): {unknown}")
    if missing := sorted(set(known) - names):
        raise ValueError(f"missing figures markers in the doc: {missing}")


def replace_blocks(doc: str, rendered: Mapping[str, str]) -> str:
    """`doc` with each block's content replaced by `rendered[name]`, set off by blank lines
    (so that a table right after a marker is still a table)."""
    check_names(doc, rendered)
    pieces, cursor = [], 0
    for name, start, end in blocks(doc):
        pieces += [doc[cursor:start], "\n\n" + rendered[name].strip("\n") + "\n\n"]
        cursor = end
    return "".join(pieces) + doc[cursor:]


def changed_blocks(doc: str, rendered: str) -> list[str]:
    """The names of the blocks whose content differs between two versions of a doc."""
    before = {name: doc[start:end] for name, start, end in blocks(doc)}
    return [
        name for name, start, end in blocks(rendered) if before.get(name) != rendered[start:end]
    ]
