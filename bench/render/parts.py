"""Renderers of the part-by-part benchmarks: transport, envserver, learner, weight_group,
engine_update_memory, lora_sync and lora_parity (the actor and shared-prefix training have
modules of their own)."""

from __future__ import annotations

import re

from bench.render.markdown import (
    MISSING,
    Figures,
    check,
    count,
    fixed,
    join,
    millions,
    provenance,
    table,
)

ENVSERVER_TARGET_SESSIONS = 64


def transport(f: Figures) -> str:
    repeats = f.get("repeats")
    setup = (
        f"{count(f.get('trajectories'))} trajectories of {count(f.get('tokens_per_trajectory'))}"
        f" tokens ({count(f.get('message_bytes'))} bytes each)"
        + (f", best of {repeats} runs per mode." if repeats else ".")
    )
    rows = [
        ["Tether end to end, tokens/s", millions(f.get("e2e_tokens_per_s"))],
        ["core NATS, same bytes, tokens/s", millions(f.get("core_nats_tokens_per_s"))],
        ["**ratio** (Tether / core NATS)", fixed(f.get("ratio"))],
    ]
    target = check("Tether end to end", f.get("e2e_tokens_per_s"), 5e6, ">=", _tokens_per_s)
    return join(setup, table(["figure", "value"], rows), target, provenance(f))


def _tokens_per_s(value: object) -> str:
    return f"{millions(value)} tokens/s"


def envserver(f: Figures) -> str:
    sessions = sorted(int(m.group(1)) for k in f if (m := re.fullmatch(r"steps_per_s_(\d+)", k)))
    rows = [
        [
            str(n),
            count(f.get(f"steps_per_s_{n}")),
            count(f.get(f"echo_steps_per_s_{n}")),
            fixed(f.get(f"ratio_vs_echo_{n}")),
            f"{fixed(f.get(f'p50_ms_{n}'))} / {fixed(f.get(f'p99_ms_{n}'))}",
            f"{fixed(f.get(f'echo_p50_ms_{n}'))} / {fixed(f.get(f'echo_p99_ms_{n}'))}",
        ]
        for n in sessions
    ]
    header = ["sessions", "ours steps/s", "echo steps/s", "ratio", "ours p50 / p99 ms"]
    n = ENVSERVER_TARGET_SESSIONS
    return join(
        f"{fixed(f.get('seconds_per_point'), 1)} s of load per point.",
        table(header + ["echo p50 / p99 ms"], rows),
        check(f"steps/s at {n} sessions", f.get(f"steps_per_s_{n}"), 2000, ">=", count)
        + "\n"
        + check(f"ratio vs echo at {n} sessions", f.get(f"ratio_vs_echo_{n}"), 0.7, ">=", fixed),
        provenance(f),
    )


def learner(f: Figures) -> str:
    setup = (
        f"{f.get('steps', MISSING)} optimizer steps of {count(f.get('tokens_per_step'))} tokens"
        f" ({count(f.get('trajectories'))} trajectories), micro-batches of"
        f" {count(f.get('micro_batch_tokens'))} tokens, torch on {f.get('torch_threads')}"
        f" thread(s), best of {f.get('repeats', MISSING)} alternating runs per side."
    )
    rows = [
        ["learner loop, tokens/s", count(f.get("learner_tokens_per_s"))],
        ["bare torch loop, tokens/s", count(f.get("bare_torch_tokens_per_s"))],
        ["**ratio_vs_bare_torch**", fixed(f.get("ratio_vs_bare_torch"), 3)],
    ]
    target = check("ratio_vs_bare_torch", f.get("ratio_vs_bare_torch"), 0.95, ">=", _three)
    return join(setup, table(["figure", "value"], rows), target, provenance(f))


def weight_group(f: Figures) -> str:
    setup = (
        f"{f.get('receivers', MISSING)} receivers, a {f.get('model_mib', MISSING)} MiB model,"
        f" {f.get('rounds', MISSING)} rounds per mode; medians of the learner-side round."
    )
    saved = f"{fixed(f.get('saved_per_update_ms'), 1)} ms"
    rows = [
        ["long-lived group, ms per round", fixed(f.get("long_lived_round_ms_median"), 1)],
        ["a new group per version, ms per round", fixed(f.get("fresh_group_round_ms_median"), 1)],
        ["saved per update", saved],
        ["new group / long-lived", f"{fixed(f.get('fresh_over_long_lived'))}x"],
    ]
    return join(setup, table(["figure", "value"], rows), provenance(f))


def lora_sync(f: Figures) -> str:
    setup = (
        f"Rank {f.get('rank', MISSING)} adapter, {f.get('rounds', MISSING)} rounds of each kind"
        " per engine; median stall from pause to resume."
    )
    rows = [
        [
            "bytes per update",
            count(f.get("full_bytes_per_update")),
            count(f.get("adapter_bytes_per_update")),
            fixed(f.get("adapter_over_full_bytes")),
        ]
    ]
    for kind, label in (("vllm_lora", "stall, vLLM's LoRA (ms)"), ("merged", "stall, merged (ms)")):
        rows.append(
            [
                label,
                fixed(f.get(f"{kind}_full_stall_ms"), 1),
                fixed(f.get(f"{kind}_adapter_stall_ms"), 1),
                fixed(f.get(f"{kind}_adapter_over_full_stall")),
            ]
        )
    header = ["figure", "full weights", "adapter", "adapter / full"]
    return join(setup, table(header, rows), provenance(f))


def lora_parity(f: Figures) -> str:
    prompts = f.get("prompts")
    setup = (
        f"Snapshot v{f.get('snapshot_version', MISSING)} of a LoRA run (rank"
        f" {f.get('adapter_rank', MISSING)}), the first {prompts} eval prompts,"
        f" {count(f.get('reference_tokens'))} reference tokens; the adapter changes the greedy"
        f" output of {f.get('prompts_the_adapter_changes', MISSING)} of them."
    )
    rows = [
        ["vLLM's LoRA", f"{f.get('vllm_lora_prompts_equal', MISSING)} of {prompts}"],
        ["merged into the base weights", f"{f.get('merged_prompts_equal', MISSING)} of {prompts}"],
    ]
    lines = [
        _all_equal(f"{label} equals transformers + PEFT", f.get(key), prompts)
        for key, label in (
            ("vllm_lora_prompts_equal", "vLLM's LoRA"),
            ("merged_prompts_equal", "merged"),
        )
    ]
    header = ["engine", "prompts equal token for token"]
    return join(setup, table(header, rows), "\n".join(lines), provenance(f))


def _all_equal(what: str, equal: object, prompts: object) -> str:
    verdict = "**met**" if equal == prompts and prompts else "**missed**"
    return f"- {what} on every prompt: {equal} of {prompts} (target: all): {verdict}"


def _three(value: object) -> str:
    return fixed(value, 3)


def engine_update_memory(f: Figures) -> str:
    setup = (
        f"A random Qwen2 (`{f.get('model', MISSING)}`) of {millions(f.get('model_parameters'))}"
        f" parameters, {count(f.get('model_mb'))} MB of fp32, in {count(f.get('bucket_mb'))} MB"
        f" buckets (the largest {count(f.get('largest_bucket_mb'))} MB: a tensor larger than a"
        f" bucket travels alone); the largest growth over {f.get('rounds_per_mode', MISSING)}"
        " rounds per mode."
    )
    modes = (
        ("receive_only", "receive path alone (nothing loaded)"),
        ("streamed", "streamed engine (the default)"),
        ("staged", "staged engine"),
    )
    rows = [
        [
            label,
            count(f.get(f"{mode}_growth_mb")),
            fixed(f.get(f"{mode}_growth_largest_buckets")),
            fixed(f.get(f"{mode}_growth_buckets"), 1),
        ]
        for mode, label in modes
    ]
    growth = table(["host memory growth", "MB", "largest buckets", "buckets"], rows)
    engines = ("streamed", "staged")
    times = table(
        ["per round, ms", "receive path alone", "streamed", "staged"],
        [
            ["stall (pause to resume)", "—"]
            + [count(f.get(f"{mode}_stall_ms")) for mode in engines],
            ["sender's transfer"]
            + [count(f.get(f"{mode}_sender_transfer_ms")) for mode in ("receive_only", *engines)],
        ],
    )
    targets = "\n".join(  # four places: a growth at the bound reads 2.00 either way
        check(
            f"{label}, largest buckets",
            f.get(f"{mode}_growth_largest_buckets"),
            2,
            "<=",
            lambda v: fixed(v, 4),
        )
        for mode, label in modes[:2]
    )
    return join(setup, growth, times, targets, provenance(f))
