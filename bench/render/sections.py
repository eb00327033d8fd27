"""The rendered blocks of docs/benchmarks.md: each marker name, the results file it reads
and the function that renders it. `render_all` is the pure core of bench/render_docs.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bench.render import (
    actor,
    agent,
    agentic,
    bound,
    costs,
    delta,
    fleet,
    head,
    parts,
    peer,
    prefix,
    profile,
    projection,
    resume,
    rules,
    scale,
    stall,
    system,
    tasks,
)
from bench.render.markdown import Figures

NOT_MEASURED = "_Not measured yet: run `{command}`._"


@dataclass(frozen=True)
class Section:
    results: str | None
    """bench/results/<results>.json; None for a section computed from constants alone."""
    render: Callable[[Figures], str]
    command: str = "make bench"
    """What writes the results file (shown while it is missing)."""
    optional: bool = False
    """Render from an empty dict when the file is missing, instead of "not measured"."""


SECTIONS: dict[str, Section] = {
    "transport": Section("transport", parts.transport),
    "envserver": Section("envserver", parts.envserver),
    "learner": Section("learner", parts.learner),
    "actor": Section("actor", actor.actor),
    "prefix_sharing": Section("prefix_sharing", prefix.prefix_sharing),
    "weight_group": Section("weight_group", parts.weight_group),
    "engine_update_memory": Section("engine_update_memory", parts.engine_update_memory),
    "head_memory": Section("head_memory", head.head_memory, "python -m bench.head_memory"),
    "scale": Section("scale", scale.scale, "make bench-scale"),
    "lora_sync": Section("lora_sync", parts.lora_sync),
    "lora_parity": Section("lora_parity", parts.lora_parity, "python -m bench.lora_parity"),
    "peer_trl": Section("peer_trl", peer.peer_trl),
    "profile_steps": Section("profile_steps", profile.profile_steps),
    "async": Section("async", system.async_speedup),
    "async-gpu-model": Section("async", system.async_gpu_model),
    "agentic": Section("agentic", agentic.agentic, "make bench-agentic"),
    "token_rule": Section("token_rule", rules.token_rule, "python -m bench.token_rule"),
    "auto_bound": Section("auto_bound", bound.auto_bound, "python -m bench.auto_bound"),
    "elastic": Section("elastic", fleet.elastic, "python -m bench.elastic"),
    "elastic_sim": Section("elastic_sim", fleet.elastic_sim, "python -m bench.elastic_sim"),
    "staleness": Section("staleness", system.staleness),
    "weightsync": Section("weightsync", system.weightsync),
    "update_stall": Section("update_stall", stall.update_stall, "python -m bench.update_stall"),
    "delta_sync": Section("delta_sync", delta.delta_sync, "python -m bench.delta_sync"),
    "episode_resume": Section(
        "episode_resume", resume.episode_resume, "python -m bench.episode_resume"
    ),
    "agent_workflow": Section(
        "agent_workflow", agent.agent_workflow, "python -m bench.agent_workflow"
    ),
    "tasks": Section("tasks", tasks.tasks, "python -m bench.tasks"),
    "make_bench": Section("make_bench", costs.make_bench),
    "projection-weights": Section(None, projection.weights),
    "projection-staleness": Section("async", projection.staleness, optional=True),
}


def render_section(section: Section, results: Mapping[str, Figures]) -> str:
    if section.results is None:
        return section.render({})
    figures = results.get(section.results)
    if figures is None:
        return (
            section.render({}) if section.optional else NOT_MEASURED.format(command=section.command)
        )
    return section.render(figures)


def render_all(results: Mapping[str, Figures]) -> dict[str, str]:
    """Every section's markdown from the results files read so far (name -> figures)."""
    return {name: render_section(section, results) for name, section in SECTIONS.items()}
