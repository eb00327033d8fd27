"""Renderer of bench/actor.py's figures: the actor against raw vLLM on the same requests,
where the CPU goes, and the shares that say whether the actor or the engine is the limit."""

from __future__ import annotations

from bench.render.markdown import MISSING, Figures, check, count, fixed, join, percent, provenance
from bench.render.markdown import table as md_table

PARTS = ("client", "engine", "env", "nats_server")


def actor(f: Figures) -> str:
    setup = (
        f"{f.get('rounds', MISSING)} rounds of {f.get('tasks_per_round', MISSING)} groups of"
        f" {f.get('group_size', MISSING)} for `max_num_seqs` {f.get('max_num_seqs', MISSING)},"
        f" the engine's OpenMP threads bound to core {f.get('cpu_threads_bind', MISSING)};"
        f" engine start-up {fixed(f.get('engine_startup_s'), 1)} s, teaching"
        f" {fixed(f.get('teach_s'), 1)} s (not timed)."
    )
    target = check("ratio_vs_raw_vllm", f.get("ratio_vs_raw_vllm"), 0.9, ">=", fixed)
    return join(setup, md_table(["figure", "value"], _rows(f)), target, _shares(f), provenance(f))


def _cpu(f: Figures, phase: str, parts: tuple[str, ...]) -> str:
    return " / ".join(fixed(f.get(f"{phase}_cpu_s_per_1k_tokens_{part}")) for part in parts)


def _rows(f: Figures) -> list[list[str]]:
    return [
        ["actor tokens/s", count(f.get("actor_tokens_per_s"))],
        ["raw offline tokens/s", count(f.get("raw_offline_tokens_per_s"))],
        ["raw by turn tokens/s", count(f.get("raw_by_turn_tokens_per_s"))],
        [
            "**ratio_vs_raw_vllm** (median of the per-round ratios)",
            f"**{fixed(f.get('ratio_vs_raw_vllm'))}** ({f.get('round_ratios', MISSING)})",
        ],
        [
            "ratio_vs_raw_offline / ratio_vs_raw_by_turn",
            f"{fixed(f.get('ratio_vs_raw_offline'))} / {fixed(f.get('ratio_vs_raw_by_turn'))}",
        ],
        [
            "generated tokens / requests / episodes",
            " / ".join(count(f.get(k)) for k in ("generated_tokens", "requests", "episodes")),
        ],
        ["mean generated tokens per request", fixed(f.get("mean_tokens_per_request"), 1)],
        [
            "requests in flight, actor / raw by turn",
            f"{count(f.get('actor_requests_in_flight'))} /"
            f" {count(f.get('by_turn_requests_in_flight'))}",
        ],
        [
            "episode wall / generation / env step, mean s",
            " / ".join(fixed(f.get(f"episode_{k}_s_mean")) for k in ("wall", "generate", "env")),
        ],
        ["stop reasons", str(f.get("stop_reasons", MISSING))],
        [
            "CPU s per 1k tokens, actor: client / engine / env server / nats",
            _cpu(f, "actor", PARTS),
        ],
        ["CPU s per 1k tokens, raw offline: client / engine", _cpu(f, "offline", PARTS[:2])],
        ["CPU s per 1k tokens, raw by turn: client / engine", _cpu(f, "by_turn", PARTS[:2])],
        [
            "cores used, actor / raw offline / raw by turn",
            " / ".join(fixed(f.get(f"{p}_cores_used")) for p in ("actor", "offline", "by_turn")),
        ],
    ]


def _shares(f: Figures) -> str:
    """The two shares the method's reasoning rests on, computed from this run."""
    engine = f.get("actor_cpu_s_per_1k_tokens_engine")
    own = [f.get(f"actor_cpu_s_per_1k_tokens_{part}") for part in ("client", "env", "nats_server")]
    wall, env = f.get("episode_wall_s_mean"), f.get("episode_env_s_mean")
    lines = []
    if isinstance(engine, float) and all(isinstance(v, float) for v in own):
        share = percent(sum(own) / engine)
        lines.append(
            f"- The actor's own CPU (client, env server, nats-server) is {share} of the"
            " engine's, per token."
        )
    if isinstance(wall, float) and isinstance(env, float):
        lines.append(f"- Env steps take {percent(env / wall, 1)} of an episode's wall time.")
    return "\n".join(lines)
