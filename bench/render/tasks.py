"""The tasks block on its own: bench/tasks.py prints it when its run ends."""

from __future__ import annotations

from bench.render.formats import Figures
from bench.render.sections import render_section


def tasks(figures: Figures) -> str:
    return render_section("tasks", {"tasks": figures})
