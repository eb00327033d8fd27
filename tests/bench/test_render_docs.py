"""docs/benchmarks.md is generated: `python -m bench.render_docs` rewrites each block between
`<!-- figures:NAME -->` markers from bench/results/*.json through the template
docs/benchmarks/NAME.md.j2. Checked through that command line alone, never by importing
bench: the committed doc is what the committed results make; the hand-written text quotes no
measured number; each block's tables and target lines from small hand-made figures (a target
on either side of its bound and at it); a missing results file; the marker replacement and
its errors. Also bench/runner.py's command line, on a package of stand-in benchmarks.
Nothing here runs a benchmark."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "benchmarks.md"
BLOCK = re.compile(r"<!-- figures:([\w-]+) -->(.*?)<!-- /figures:\1 -->", re.S)
SECTIONS = [name for name, _ in BLOCK.findall(DOC.read_text())]
# Numbers that look measured: decimals, thousands, multiples, percentages, quantities with
# a unit of time or size.
MEASURED_LOOKING = [
    r"\d+\.\d+",
    r"\d,\d{3}",
    r"\b\d+(\.\d+)?x\b",
    r"\d+(\.\d+)?\s?%",
    r"\b\d+(\.\d+)?\s?(ms|s|min|minutes|seconds|hours|KB|MB|GB|MiB|GiB|Gb/s|GB/s|MB/s|M|K|k)\b",
]
ALLOWED = ("torch==2.13.0", "trl==1.16.0", "127.0.0.1")  # TRL's pins, the loopback address


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def _blocks(doc: str) -> dict[str, str]:
    return {name: content.strip("\n") for name, content in BLOCK.findall(doc)}


def _outside(doc: str) -> str:
    return BLOCK.sub(lambda m: f"<!-- figures:{m[1]} --><!-- /figures:{m[1]} -->", doc)


def _markers(names: list[str]) -> str:
    return "".join(f"<!-- figures:{n} -->\n<!-- /figures:{n} -->\n" for n in names)


def _render(tmp_path: Path, results: dict[str, dict], doc: str | None = None, *flags: str):
    """Run the renderer over `results` (file name -> figures) and `doc` (every section's
    markers, or the doc left by the last run here); the run, and the doc it left."""
    (tmp_path / "results").mkdir(exist_ok=True)
    for name, figures in results.items():
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(figures))
    path = tmp_path / "doc.md"
    if doc is not None or not path.exists():
        path.write_text(_markers(SECTIONS) if doc is None else doc)
    paths = ["--results", str(tmp_path / "results"), "--doc", str(path)]
    return _run("bench.render_docs", *paths, *flags), path.read_text()


def _agentic_modes() -> list[str]:
    """The modes bench/agentic.py runs, read from its source (the block labels each)."""
    for node in ast.parse((REPO / "bench" / "agentic.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "MODES":
            return [key.value for key in node.value.keys]
    raise AssertionError("bench/agentic.py has no MODES")


def _staleness(**changes: float) -> dict:
    figures = {"eval_prompts": 100, "eval_samples": 2}
    for k, none in ((0, 0.9), (2, 0.8)):
        for correction, mean in (("none", none), ("tis", 0.9), ("decoupled", 0.9)):
            for stat, value in (("mean", mean), ("std", 0.01), ("min", mean), ("max", mean)):
                figures[f"pass1_k{k}_{correction}_{stat}"] = value
    return figures | changes


def _agentic(**changes: float) -> dict:
    figures = {"steps": 12, "agentic_tool_median_ms": 500.0, "agentic_tool_p99_s": 8.0}
    runs = {"tools_b1-cap8": (2.0, 1.0, 1, 0.6), "tools_b1": (2.0, 1.0, 1, 0.6),
            "agentic_sync": (8.0, 1.0, 0, 0.6), "agentic_b4": (2.5, 3.2, 4, 0.62)}  # fmt: skip
    for run, (s_per_step, speedup, staleness, pass_at_1) in runs.items():
        figures |= {f"{run}_s_per_step": s_per_step, f"{run}_speedup": speedup,
                    f"{run}_max_staleness_seen": staleness, f"{run}_pass_at_1": pass_at_1,
                    f"{run}_learner_idle_frac": 0.5, f"{run}_actor_idle_frac": 0.5}  # fmt: skip
    return figures | changes


def _make_bench(total_s: float) -> dict:
    return {"scripts": "actor", "actor_s": total_s, "actor_load_avg_1m_before": 1.0,
            "actor_load_avg_1m_after": 2.0, "total_s": total_s}  # fmt: skip


CPU = "actor_cpu_s_per_1k_tokens"
PEER = {"target_pass1": 0.8, "pass1_start": 0.5, "trl_pass1_step02": 0.85, "trl_t_step02_s": 20,
        "tether_pass1_step02": 0.7, "tether_t_step02_s": 150, "tether_inrun_pass1_v05": 0.75,
        "trl_time_to_pass1_0p8_s": 20.0, "tether_startup_s": 140.0, "trl_per_step_s": 3.0,
        "trl_generate_per_step_s": 2.0, "trl_train_per_step_s": 1.0, "tether_per_step_s": 5.0,
        "tether_train_per_step_s": 4.0, "tether_new_part_per_step_s": 1.0,
        "tether_engine_busy_per_step_s": 2.5, "tether_learner_wait_frac": 0.02}  # fmt: skip
SCALE = {"loopback_mb_per_s": 3000.0}
for size, params in {"10M": 9_847_360, "0.5B": 494_032_768}.items():
    SCALE |= {f"{size}/params": params, f"{size}/weights_gb": 4 * params / 1e9,
              f"{size}/learner_peak_gb": 9.0, f"{size}/bare_activation_gb": 1.0,
              f"{size}/wire_of_loopback": 0.4}  # fmt: skip
LATENCY = {"tool_latency_median_ms": 2000.0, "tool_latency_p99_s": 2.0}  # a tail of 2 s
MET = {
    "transport": {"e2e_tokens_per_s": 6e6, "core_nats_tokens_per_s": 5e6, "ratio": 1.2,
                  "measured_at": "T", "machine": "m", "load_avg_1m_before": 1.0},
    "envserver": {"steps_per_s_64": 2500, "echo_steps_per_s_64": 3000, "ratio_vs_echo_64": 0.8},
    "learner": {"learner_tokens_per_s": 960, "ratio_vs_bare_torch": 0.96},
    "actor": {"ratio_vs_raw_vllm": 0.91, "round_ratios": "0.8 1.0", f"{CPU}_engine": 1.0,
              f"{CPU}_client": 0.1, f"{CPU}_env": 0.05, f"{CPU}_nats_server": 0.05,
              "episode_wall_s_mean": 10.0, "episode_env_s_mean": 0.5},
    "prefix_sharing": {"unshared_tokens_per_s_ratio_8192_vs_1024": 0.95, "budget": 8192,
                       "demo_shared_step_s": 0.5, "demo_speedup_shared_vs_current": 4.0},
    "weightsync": {"ratio_vs_loopback": 0.6, "stall_in_decode_steps": 1.5,
                   "loopback_bytes_per_s": 1.5e9, "engine_pause_ms_k2": 30.0,
                   "engine_receive_ms_k2": 300.0, "engine_load_ms_k2": 100.0},
    "async": LATENCY | {"speedup": 3.0, "learner_idle_frac": 0.05, "actor_idle_frac": 0.05,
        "sync_s_per_step": 4.0, "async_s_per_step": 5.0, "sync_wait_data_s_per_step": 3.0,
        "sync_train_s_per_step": 1.25, "async_train_s_per_step": 3.125,
        "sync_broadcast_s_per_step": 0.25, "sync_engine_busy_s_per_step": 1.0,
        "model_gpu_sync_s_per_step": 4.5, "model_gpu_async_s_per_step": 1.5,
        "model_gpu_speedup": 3.0, "model_gpu_learner_idle_frac": 0.0,
        "model_gpu_actor_idle_frac": 1 / 3},
    "staleness": _staleness(pass1_k2_decoupled_mean=0.85),
    "peer_trl": PEER | {"ratio": 0.4},
    "lora_parity": {"prompts": 30, "vllm_lora_prompts_equal": 30, "merged_prompts_equal": 30},
    "lora_sync": {"vllm_lora_full_stall_ms": 200.0, "vllm_lora_adapter_stall_ms": 50.0,
                  "vllm_lora_adapter_over_full_stall": 0.25},
    "weight_group": {"saved_per_update_ms": 70.0, "fresh_over_long_lived": 2.0},
    "engine_update_memory": {"streamed_growth_mb": 1200.0, "streamed_growth_largest_buckets": 2.0,
        "receive_only_growth_largest_buckets": 1.0, "staged_growth_largest_buckets": 5.5},
    "make_bench": _make_bench(30 * 60),
    "agentic": _agentic(agentic_sync_wait_data_s_per_step=6.0, agentic_sync_train_s_per_step=0.4,
        agentic_sync_broadcast_s_per_step=0.1, agentic_sync_engine_busy_s_per_step=1.0),
    "scale": SCALE,
}  # fmt: skip
MISSED = {
    "transport": {"e2e_tokens_per_s": 4e6, "load_avg_1m_before": 1.0, "load_avg_1m_after": 2.25},
    "envserver": {"steps_per_s_64": 1500, "ratio_vs_echo_64": 0.6},
    "learner": {"ratio_vs_bare_torch": 0.94},
    "actor": MET["actor"] | {"ratio_vs_raw_vllm": 0.89},
    "prefix_sharing": {"unshared_tokens_per_s_ratio_8192_vs_1024": 0.85},
    "weightsync": {"ratio_vs_loopback": 0.4, "stall_in_decode_steps": 3},
    "async": {"speedup": 1.2, "learner_idle_frac": 0.2, "actor_idle_frac": 0.1,
              "async_s_per_step": 4.0},
    "staleness": _staleness(),
    "peer_trl": PEER | {"ratio": 7.7},
    "lora_parity": {"prompts": 30, "vllm_lora_prompts_equal": 29, "merged_prompts_equal": 30},
    "make_bench": _make_bench(50 * 60),
    "agentic": _agentic(agentic_b4_speedup=2.5, agentic_b4_max_staleness_seen=5,
                        tools_b1_s_per_step=2.2, agentic_b4_pass_at_1=0.3),
}  # fmt: skip
EDGE = {
    "transport": {"measured_at": "T", "commit": "0123abcd+changes", "load_avg_1m": 11.94},
    "envserver": {"seconds_per_point": 3.0},
    "learner": {"ratio_vs_bare_torch": 0.95},
    "weightsync": {"stall_in_decode_steps": 2.0},
    "async": LATENCY | {"async_s_per_step": 2.0},
    "agentic": {"steps": 12} | {f"tools_{mode}_s_per_step": 1.0 for mode in _agentic_modes()},
}


@pytest.fixture(scope="module")
def hand_made(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Every block of each hand-made set, a set rendered in one run."""
    sets = {}
    for name, figures in (("met", MET), ("missed", MISSED), ("edge", EDGE)):
        done, doc = _render(tmp_path_factory.mktemp(name), figures)
        assert done.returncode == 0, done.stderr
        sets[name] = _blocks(doc)
    return sets


# --- the committed doc -------------------------------------------------------------------


def test_the_committed_doc_is_what_the_committed_results_make():
    done = _run("bench.render_docs", "--results", str(RESULTS), "--doc", str(DOC), "--check")
    assert done.returncode == 0, done.stdout + done.stderr + "run `python -m bench.render_docs`"


def test_the_hand_written_text_quotes_no_measured_number():
    text = _outside(DOC.read_text())
    for allowed in ALLOWED:
        text = text.replace(allowed, "")
    found = [
        f"line {n}: {match.group(0)!r} in {line.strip()!r}"
        for n, line in enumerate(text.splitlines(), 1)
        for pattern in MEASURED_LOOKING
        for match in re.finditer(pattern, line)
    ]
    assert found == [], "measured numbers belong in a rendered block"


def test_every_section_has_one_block_a_template_and_its_results_run():
    templates = (REPO / "docs" / "benchmarks").glob("*.md.j2")
    assert sorted(p.name.removesuffix(".md.j2") for p in templates) == sorted(set(SECTIONS))
    assert len(set(SECTIONS)) == len(SECTIONS)
    assert "benchmark-history.md" in DOC.read_text()
    assert (REPO / "docs" / "benchmark-history.md").read_text().count("Not regenerated") == 1
    for name, text in _blocks(DOC.read_text()).items():
        assert text.strip(), name
        if (RESULTS / f"{name}.json").exists():
            assert json.loads((RESULTS / f"{name}.json").read_text())["measured_at"] in text


def test_the_committed_blocks_show_the_figures_of_their_results():
    """Read from the JSON: a new `make bench` run changes the values, not this test."""
    blocks = _blocks(DOC.read_text())
    names = ("envserver", "actor", "async", "peer_trl")
    env, actor, speedup, peer = (json.loads((RESULTS / f"{n}.json").read_text()) for n in names)
    assert (f"| 64 | {env['steps_per_s_64']:,.0f} | {env['echo_steps_per_s_64']:,.0f} |"
            f" {env['ratio_vs_echo_64']:.2f} |") in blocks["envserver"]  # fmt: skip
    assert f"ratio_vs_raw_vllm: {actor['ratio_vs_raw_vllm']:.2f} (target ≥ 0.90)" in blocks["actor"]
    assert f"(sync s per step / async): {speedup['speedup']:.2f}x" in blocks["async"]
    assert (f"| 4 | {peer['trl_pass1_step04']:.3f} | {peer['trl_t_step04_s']:.0f} |"
            f" {peer['tether_pass1_step04']:.3f} | {peer['tether_t_step04_s']:.0f} |"
            in blocks["peer_trl"])  # fmt: skip
    assert f"from launch): {peer['ratio']:.2f}" in blocks["peer_trl"]


# --- rewriting a doc ---------------------------------------------------------------------


def test_a_doc_is_rewritten_in_its_blocks_only_and_missing_results_are_not_measured(tmp_path):
    doc = "intro\n" + "".join(
        f"<!-- figures:{n} -->\nold {n}\n<!-- /figures:{n} -->\n{n} prose\n" for n in SECTIONS
    )
    results = {"transport": {"ratio": 1.5, "measured_at": "T"}, "agentic": {"steps": 12}}
    stale, left = _render(tmp_path, results, doc, "--check")
    assert stale.returncode == 1 and "transport, envserver, learner," in stale.stdout
    assert left == doc  # --check writes nothing
    done, once = _render(tmp_path, results)
    assert (
        done.returncode == 0 and "rendered transport" in done.stdout and "(missing)" in done.stdout
    )
    assert re.findall(r"^rendered (\S+)", done.stdout, re.M) == SECTIONS  # the doc's order
    assert _outside(once) == _outside(doc)
    not_measured = "\n\n_Not measured yet: run `make bench`._\n\n"
    assert f"<!-- figures:learner -->{not_measured}<!-- /figures:learner -->" in once
    again, twice = _render(tmp_path, results)
    assert again.returncode == 0 and twice == once
    assert _render(tmp_path, results, None, "--check")[0].returncode == 0
    blocks = _blocks(once)
    assert "| **ratio** (Tether / core NATS) | 1.50 |" in blocks["transport"]
    assert blocks["agentic"] == "bench/results/agentic.json has no runs."
    assert blocks["lora_parity"] == "_Not measured yet: run `python -m bench.lora_parity`._"
    assert "| 7B (7.62B parameters) |" in blocks["projection-weights"]  # from constants
    assert "k needed" in blocks["projection-staleness"]  # optional: its models still show
    unmeasured = [n for n, text in blocks.items() if text.startswith("_Not measured yet: run `")]
    assert len(unmeasured) == len(SECTIONS) - 4  # transport, agentic, the two projections


FIRST, LAST = SECTIONS[0], SECTIONS[-1]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_markers([*SECTIONS, "c"]), "unknown figures markers"),
        (_markers(SECTIONS[1:]), "missing figures markers"),
        (_markers(SECTIONS).replace(f"<!-- /figures:{LAST} -->", ""), "never closed"),
        (_markers(SECTIONS).replace(f"<!-- /figures:{FIRST} -->", ""), "opens inside"),
        (_markers(SECTIONS).replace(f"<!-- figures:{FIRST} -->", ""), "a block that is not open"),
        (_markers([*SECTIONS, FIRST]), "more than once"),
    ],
)
def test_bad_markers_are_clear_errors(tmp_path, doc, message):
    done, after = _render(tmp_path, {}, doc)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert after == doc


# --- each block from hand-made figures ---------------------------------------------------

# A piece of the text of a block rendered from a set of hand-made figures, a line each: the
# set, the block, then the text (\n a line break).
EXPECTED = r"""
met transport: | Tether end to end, tokens/s | 6.0 M |
met transport: - Tether end to end: 6.0 M tokens/s (target ≥ 5.0 M tokens/s): **met**
missed transport: | 4.0 M |\n| core NATS, same bytes, tokens/s | — |
missed transport: : 4.0 M tokens/s (target ≥ 5.0 M tokens/s): **missed**
met transport: _Measured T on m; (load average not recorded)._
missed transport: _Measured at an unrecorded time at 1-minute load average 1.0 before and 2.2
edge transport: _Measured T from commit 0123abcd+changes at 1-minute load average 11.9._
met envserver: | 64 | 2,500 | 3,000 | 0.80 | — / — | — / — |
met envserver: - steps/s at 64 sessions: 2,500 (target ≥ 2,000): **met**\n- ratio vs echo
met envserver: - ratio vs echo at 64 sessions: 0.80 (target ≥ 0.70): **met**
missed envserver: - steps/s at 64 sessions: 1,500 (target ≥ 2,000): **missed**
missed envserver: - ratio vs echo at 64 sessions: 0.60 (target ≥ 0.70): **missed**
edge envserver: - steps/s at 64 sessions: — (target ≥ 2,000): not measured
met learner: | learner loop, tokens/s | 960 |\n| bare torch loop, tokens/s | — |
met learner: - ratio_vs_bare_torch: 0.960 (target ≥ 0.950): **met**
missed learner: - ratio_vs_bare_torch: 0.940 (target ≥ 0.950): **missed**
edge learner: - ratio_vs_bare_torch: 0.950 (target ≥ 0.950): **met**
met actor: | **0.91** (0.8 1.0) |
met actor: - ratio_vs_raw_vllm: 0.91 (target ≥ 0.90): **met**
missed actor: - ratio_vs_raw_vllm: 0.89 (target ≥ 0.90): **missed**
met actor: (client, env server, nats-server) is 20% of the engine's
met actor: Env steps take 5.0% of an episode's wall time
met prefix_sharing: | demo | shared, 8,192 tokens | 0.50 |
met prefix_sharing: | demo | — / — | 4.00x |
met prefix_sharing: (target ≥ 0.90): **met**\n\n_Measured at an unrecorded time (load average
missed prefix_sharing: : 0.85 (target ≥ 0.90): **missed**
met weightsync: | engine's account: pause / receive / load, ms | — / — / — | 30 / 300 / 100 |
met weightsync: | loopback, one TCP stream, MB/s | 1,500 |  |
met weightsync: - ratio_vs_loopback (the smaller K's): 0.60 (target ≥ 0.50): **met**
met weightsync: - stall in decode steps: 1.5 (target ≤ 2.0): **met**
missed weightsync: - ratio_vs_loopback (the smaller K's): 0.40 (target ≥ 0.50): **missed**
missed weightsync: - stall in decode steps: 3.0 (target ≤ 2.0): **missed**
edge weightsync: - stall in decode steps: 2.0 (target ≤ 2.0): **met**
met async: - speedup (sync s per step / async): 3.00x (target ≥ 2.50x): **met**
met async: - learner idle fraction, async: 0.050 (target < 0.100): **met**
met async: - actor idle fraction, async: 0.050 (target < 0.100): **met**
missed async: - speedup (sync s per step / async): 1.20x (target ≥ 2.50x): **missed**
missed async: - learner idle fraction, async: 0.200 (target < 0.100): **missed**
missed async: - actor idle fraction, async: 0.100 (target < 0.100): **missed**
met async: | seconds per step | 4.00 | 5.00 |
met async: (the same step with the engines generating beside it): 2.50x.
met async-gpu-model: - G = 3.00 s, T = 1.50 s, E = 1.00 s per step.
met async-gpu-model: - **Modelled speedup 3.00x**; learner idle 0%, engines idle 33%.
missed async-gpu-model: The synchronous run's parts are missing from bench/results/async.json.
met staleness: | 2 | 0.800 ± 0.010 [0.800, 0.800] | 0.900 ± 0.010 [0.900, 0.900] | 0.850 ±
met staleness: - none (PPO vs behaviour): largest loss against k = 0: 0.100.
met staleness: - TIS and decoupled PPO differ in 1 of 2 rows (k = 2).
met staleness: near 0.90 on 200 samples: sqrt(p (1 - p) / n) = 0.021.
missed staleness: - TIS and decoupled PPO differ in 0 of 2 rows.
met peer_trl: | 0 | 0.500 | — | 0.500 | — | — |\n| 2 | 0.850 | 20 | 0.700 | 150 | — |
met peer_trl: | 5 | — | — | — | — | 0.750 |
met peer_trl: (Tether's time to target / TRL's, from launch): 0.40 (target ≤ 0.50): **met**
missed peer_trl: from launch): 7.70 (target ≤ 0.50): **missed**
met peer_trl: within 10 s of launch; its start-up alone took 140 s, above that.
met peer_trl: | Tether | new part | 1.00 |\n| Tether | train | 4.00 |\n| Tether | sum of the
met peer_trl: | Tether | sum of the parts | 5.00 |
met peer_trl: waited for data 2.0% of the time: the learner is the bottleneck
met lora_parity: | vLLM's LoRA | 30 of 30 |
met lora_parity: LoRA equals transformers + PEFT on every prompt: 30 of 30 (target: all): **met**
missed lora_parity: LoRA equals transformers + PEFT on every prompt: 29 of 30 (target: all): **m
met lora_sync: | stall, vLLM's LoRA (ms) | 200.0 | 50.0 | 0.25 |
met weight_group: | saved per update | 70.0 ms |\n| new group / long-lived | 2.00x |
met engine_update_memory: | streamed engine (the default) | 1,200 | 2.00 | — |
met engine_update_memory: | staged engine | — | 5.50 | — |
met engine_update_memory: (the default), largest buckets: 2.0000 (target ≤ 2.0000): **met**
met make_bench: | `bench/actor.py` | 30.0 min | 1.0 → 2.0 |
met make_bench: - `make bench` in all: 30.0 min (target ≤ 45.0 min): **met**
missed make_bench: - `make bench` in all: 50.0 min (target ≤ 45.0 min): **missed**
met agentic: | agentic: 500 ms / 8 s | **bound 4 + TIS** | 2.50 | 3.20x | 0.50 | 0.50 | 4 |
met agentic: at the default (bound 4 + TIS): 3.20x (target ≥ 3.00x): **met**
met agentic: at the default's bound 4: 4 (target ≤ 4): **met**
met agentic: sized by the engine / fixed cap 8: 1.000 (target ≤ 1.050): **met**
met agentic: a gap of 0.020: within the 95% band of two 128-sample binomials (0.119)
missed agentic: at the default (bound 4 + TIS): 2.50x (target ≥ 3.00x): **missed**
missed agentic: at the default's bound 4: 5 (target ≤ 4): **missed**
missed agentic: sized by the engine / fixed cap 8: 1.100 (target ≤ 1.050): **missed**
missed agentic: a gap of 0.300: **outside** the 95% band
met agentic: - agentic: synchronous 6.50 s per step, asynchronous 1.00 s: **6.50x**
met scale: 0.5B: the broadcast on the wire over loopback bandwidth: 0.40 (target ≥ 0.50): **missed
met scale: (1.3 x training state + the bare loop's activations): 0.80 (target ≤ 1.00): **met**
met projection-weights: | 7B (7.62B parameters) | 15.2 GB | 0.38 s | 0.051 s | 30 s |
missed projection-staleness: exp(mu + 3.02 sigma) = 6.0 s of tool time alone
missed projection-staleness: | 4.0 s | 2 s generation + 6.0 s tool tail | 2 |
met projection-staleness: | 5.0 s | 2 s generation + 2.0 s tool tail | 0 |
edge projection-staleness: | 2.0 s | 2 s generation + 2.0 s tool tail | 1 |
"""
# Worked by hand: the actor's own CPU (0.1 + 0.05 + 0.05) / 1.0; sqrt(0.9 x 0.1 / 200);
# agentic's band 1.96 sqrt((0.6 x 0.4 + 0.62 x 0.38) / 128) and its GPU model G + T = 6.5 s,
# max(T, E) = 1.0 s; scale's 9.0 GB peak over 1.3 x 4 x 1.976 GB + 1.0 GB; a 7B step's
# 6 N FLOP x 512 x 4,096 tokens on 8 x 989 TFLOP/s at 40% MFU, its 15.2 GB at 40 GB/s; a
# group's tail the 0.99^(1/8) quantile of one call (median = p99 = 2 s: 2 s), k = ceil(T_group
# / T) - 1 (at most a step, exactly two, three).


@pytest.mark.parametrize("line", EXPECTED.strip().splitlines())
def test_each_block_from_hand_made_figures(hand_made, line):
    where, text = line.split(": ", 1)
    which, block = where.split()
    assert text.replace(r"\n", "\n") in hand_made[which][block]


def test_rows_are_those_the_figures_have(hand_made):
    met, missed, edge = hand_made["met"], hand_made["missed"], hand_made["edge"]
    assert met["agentic"].count("| tools: ") == 2 and "agentic-30s" not in met["agentic"]
    assert edge["agentic"].count("| tools: ") == len(_agentic_modes())  # a label for each mode
    assert "GPU model" in met["agentic"] and "GPU model" not in missed["agentic"]
    assert met["scale"].index("| 10M |") < met["scale"].index("| 0.5B |")
    assert "engine busy" not in met["peer_trl"].split("| side |")[1].split("\n\n")[0]


# --- bench/runner.py -----------------------------------------------------------------------


def _listed(done: subprocess.CompletedProcess) -> dict[str, str]:
    """`python -m bench.runner list`: each benchmark's line, by name."""
    assert done.returncode == 0, done.stderr
    return {line.split()[0]: line for line in done.stdout.splitlines()}


def test_make_bench_runs_every_declared_benchmark_through_the_runner():
    recipe = (REPO / "Makefile").read_text().split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert "-m bench.runner run bench" in recipe
    listed = _listed(_run("bench.runner", "list"))
    assert "render_docs" not in listed and "runner" not in listed
    for name in ("actor", "transport", "weightsync"):
        assert re.match(rf"{name}\s+bench\s", listed[name])
    assert re.match(r"gpu_learner\s+by hand\s", listed["gpu_learner"])  # needs a GPU
    # a module run as `python -m bench.NAME` is run by the runner only if it says so
    for path in sorted((REPO / "bench").glob("*.py")):
        runs = 'if __name__ == "__main__":' in path.read_text()
        if (
            runs
            and path.stem not in ("render_docs", "runner")
            and not path.stem.endswith("_worker")
        ):
            assert path.stem in listed, path.name


def _declared(target: str, then: str = "") -> str:
    declaration = f'Benchmark(measures="m", target="{target}", minutes=2)'
    return f"from bench.common import Benchmark\n\nBENCHMARK = {declaration}\n{then}"


def test_the_runner_reads_declarations_without_importing_and_times_make_bench(tmp_path):
    """The real runner in a bench package of stand-in benchmarks (the working directory
    comes first on the path); a stand-in learner says whether bf16 is native, so that
    bench/common.py's record of the machine does not import torch."""
    package = tmp_path / "bench"
    package.mkdir()
    for name in ("__init__.py", "runner.py", "common.py"):
        shutil.copy(REPO / "bench" / name, package / name)
    for name in ("a_first", "b_second"):
        (package / f"{name}.py").write_text(
            _declared("bench", f'if __name__ == "__main__":\n    print("ran {name}")\n')
        )
    (package / "heavy.py").write_text("import a_module_nobody_installed\n" + _declared("by hand"))
    (package / "helper.py").write_text('"""Declares nothing: not a benchmark."""\n')
    (package / "render_docs.py").write_text('print("rendered the docs")\n')
    (tmp_path / "learner" / "trainer").mkdir(parents=True)
    model_init = tmp_path / "learner" / "trainer" / "model_init.py"
    model_init.write_text("def native_cpu_bf16():\n    return False\n")

    listed = _listed(_run("bench.runner", "list", cwd=tmp_path))
    assert sorted(listed) == ["a_first", "b_second", "heavy"]
    assert re.match(r"heavy\s+by hand\s+~2 min\s+m$", listed["heavy"])
    done = _run("bench.runner", "run", "bench", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.index("ran a_first") < out.index("ran b_second") < out.index("rendered the docs")
    figures = json.loads((package / "results" / "make_bench.json").read_text())
    assert figures["scripts"] == "a_first b_second" and figures["machine"]
    assert figures["total_s"] == figures["a_first_s"] + figures["b_second_s"]
    assert figures["load_avg_1m_before"] == figures["a_first_load_avg_1m_before"]
    assert figures["load_avg_1m_after"] == figures["b_second_load_avg_1m_after"]

    nonliteral = 'BENCHMARK = Benchmark(measures=M, target="bench", minutes=1)\n'
    for source, message in ((_declared("nightly"), "target"), (nonliteral, "literal")):
        (package / "bad.py").write_text(source)
        done = _run("bench.runner", "list", cwd=tmp_path)
        assert done.returncode != 0 and message in done.stderr
    for name in ("bad", "a_first", "b_second"):
        (package / f"{name}.py").unlink()
    done = _run("bench.runner", "run", "bench", cwd=tmp_path)
    assert done.returncode != 0 and "no benchmark ran" in done.stderr
