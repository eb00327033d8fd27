"""The rendered blocks of docs/benchmarks.md: each block's name, the results file it reads,
and what the block computes from it; the block's prose and tables are its template,
docs/benchmarks/NAME.md.j2. `render_all` is the pure core of bench/render_docs.py: the
results files read so far in, each block's markdown out."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2

from bench.render import agentic, fleet, projection, system
from bench.render.formats import FILTERS, GLOBALS, Figures, Missing

TEMPLATES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
NOT_MEASURED = "_Not measured yet: run `{command}`._"


@dataclass(frozen=True)
class Section:
    results: str | None
    """bench/results/<results>.json; None for a block computed from constants alone."""
    command: str = "make bench"
    """What writes the results file (shown while it is missing)."""
    optional: bool = False
    """Render from no figures when the file is missing, instead of "not measured"."""
    derive: Callable[[Figures], dict[str, object]] | None = None
    """Figures computed from the file's, handed to the template beside them (`f`)."""


SECTIONS: dict[str, Section] = {
    "transport": Section("transport"),
    "envserver": Section("envserver"),
    "learner": Section("learner"),
    "actor": Section("actor", derive=system.actor),
    "prefix_sharing": Section("prefix_sharing"),
    "weight_group": Section("weight_group"),
    "engine_update_memory": Section("engine_update_memory"),
    "head_memory": Section("head_memory", "python -m bench.head_memory"),
    "scale": Section("scale", "make bench-scale", derive=system.scale),
    "lora_sync": Section("lora_sync"),
    "lora_parity": Section("lora_parity", "python -m bench.lora_parity"),
    "peer_trl": Section("peer_trl", derive=system.peer_trl),
    "profile_steps": Section("profile_steps", derive=system.profile_steps),
    "async": Section("async", derive=system.async_speedup),
    "async-gpu-model": Section("async", derive=system.async_gpu_model),
    "agentic": Section("agentic", "make bench-agentic", derive=agentic.agentic),
    "token_rule": Section("token_rule", "python -m bench.token_rule"),
    "auto_bound": Section("auto_bound", "python -m bench.auto_bound", derive=agentic.auto_bound),
    "elastic": Section("elastic", "python -m bench.elastic"),
    "elastic_sim": Section("elastic_sim", "python -m bench.elastic_sim", derive=fleet.elastic_sim),
    "staleness": Section("staleness", derive=system.staleness),
    "weightsync": Section("weightsync"),
    "update_stall": Section("update_stall", "python -m bench.update_stall"),
    "delta_sync": Section("delta_sync", "python -m bench.delta_sync"),
    "episode_resume": Section("episode_resume", "python -m bench.episode_resume"),
    "agent_workflow": Section("agent_workflow", "python -m bench.agent_workflow"),
    "tasks": Section("tasks", "python -m bench.tasks"),
    "make_bench": Section("make_bench"),
    "projection-weights": Section(None, derive=projection.weights),
    "projection-staleness": Section("async", optional=True, derive=projection.staleness),
}


@functools.cache
def templates() -> jinja2.Environment:
    """Block tags take their line with them (trim and lstrip), so that a template's loops
    and conditions sit on lines of their own without leaving blank ones behind."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=Missing,
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.do"],
        autoescape=False,  # markdown, not HTML
    )
    environment.filters.update(FILTERS)
    environment.globals.update(GLOBALS)
    environment.globals["projection"] = projection  # its assumptions, by their own names
    return environment


def render_section(name: str, results: Mapping[str, Figures]) -> str:
    """Block `name`'s markdown: its template over its results file's figures and those
    computed from them, paragraphs one blank line apart (a paragraph a template leaves
    empty, such as a reading it has no figures for, leaves no gap)."""
    section = SECTIONS[name]
    figures = results.get(section.results, None) if section.results else {}
    if figures is None and not section.optional:
        return NOT_MEASURED.format(command=section.command)
    figures = figures or {}
    extra = section.derive(figures) if section.derive else {}
    text = templates().get_template(f"{name}.md.j2").render(f=figures, **extra)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def render_all(results: Mapping[str, Figures]) -> dict[str, str]:
    """Every block's markdown from the results files read so far (name -> figures)."""
    return {name: render_section(name, results) for name in SECTIONS}
