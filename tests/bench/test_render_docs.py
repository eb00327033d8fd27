"""docs/benchmarks.md is generated: every figure in it comes from bench/results/*.json by
bench/render_docs.py. Checked here on the committed results and on small hand-made figures
(a table value, and a target line on both sides of its bound), the marker replacement, the
rule that the hand-written text quotes no measured number, and that the committed doc is
exactly what the renderer makes of the committed results. Nothing here runs a benchmark."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bench import render_docs, runner
from bench.common import Benchmark
from bench.render import actor, costs, parts, peer, prefix, projection, system
from bench.render.markdown import check, fixed, provenance
from bench.render.markers import blocks, outside_blocks, replace_blocks
from bench.render.sections import SECTIONS, Section, render_all, render_section

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "benchmarks.md"

# Numbers that look measured: decimals, thousands, multiples, percentages, quantities with
# a unit of time or size.
MEASURED_LOOKING = [
    r"\d+\.\d+",
    r"\d,\d{3}",
    r"\b\d+(\.\d+)?x\b",
    r"\d+(\.\d+)?\s?%",
    r"\b\d+(\.\d+)?\s?(ms|s|min|minutes|seconds|hours|KB|MB|GB|MiB|GiB|Gb/s|GB/s|MB/s|M|K|k)\b",
]
# Not measurements: TRL's pinned versions and the loopback address.
ALLOWED = ("torch==2.13.0", "trl==1.16.0", "127.0.0.1")


# --- the whole doc ------------------------------------------------------------------------


def test_the_committed_doc_is_what_the_renderer_makes_of_the_committed_results():
    doc = DOC.read_text()
    assert render_docs.render_doc(doc, RESULTS) == doc, "run `python -m bench.render_docs`"


def test_the_hand_written_text_quotes_no_measured_number():
    text = outside_blocks(DOC.read_text())
    for allowed in ALLOWED:
        text = text.replace(allowed, "")
    found = [
        f"line {n}: {match.group(0)!r} in {line.strip()!r}"
        for n, line in enumerate(text.splitlines(), 1)
        for pattern in MEASURED_LOOKING
        for match in re.finditer(pattern, line)
    ]
    assert found == [], "measured numbers belong in a rendered block"


def test_the_doc_has_a_block_for_every_section_and_links_the_history():
    doc = DOC.read_text()
    assert [name for name, _, _ in blocks(doc)] == list(SECTIONS)
    assert "benchmark-history.md" in doc
    assert (REPO / "docs" / "benchmark-history.md").read_text().count("Not regenerated") == 1


def test_make_bench_runs_the_declared_benchmarks_through_the_runner():
    recipe = (REPO / "Makefile").read_text().split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert "-m bench.runner run bench" in recipe
    benchmarks = runner.declared()
    assert "render_docs" not in benchmarks and "runner" not in benchmarks
    assert {"actor", "transport", "weightsync"} <= {
        name for name, b in benchmarks.items() if b.target == "bench"
    }
    assert benchmarks["gpu_learner"].target == "by hand"  # needs a GPU: never in `make bench`


def test_every_module_that_runs_is_a_declared_benchmark_or_a_tool():
    """A script run as `python -m bench.NAME` is run by the runner only if it says so; one
    that says nothing would be a benchmark nobody runs."""
    tools = {"render_docs", "runner"}  # they run benchmarks' output, and benchmarks
    for path in sorted((REPO / "bench").glob("*.py")):
        source = path.read_text()
        runs = 'if __name__ == "__main__":' in source
        if runs and path.stem not in tools and not path.stem.endswith("_worker"):
            assert runner.declaration(source, path.name) is not None, path.name


def test_a_declaration_is_read_without_importing_and_checked():
    source = 'import torch\nBENCHMARK = Benchmark(measures="m", target="by hand", minutes=2)\n'
    assert runner.declaration(source) == Benchmark(measures="m", target="by hand", minutes=2)
    assert runner.declaration("import torch\n") is None
    with pytest.raises(ValueError, match="target"):
        runner.declaration('BENCHMARK = Benchmark(measures="m", target="nightly", minutes=1)')
    with pytest.raises(ValueError, match="literal"):
        runner.declaration('BENCHMARK = Benchmark(measures=M, target="bench", minutes=1)')


# --- every section from the committed results -----------------------------------------------


@pytest.mark.parametrize("name", list(SECTIONS))
def test_every_section_renders_from_the_committed_results(name):
    results = render_docs.load_results(RESULTS)
    section = SECTIONS[name]
    text = render_section(section, results)
    assert text.strip()
    if name == section.results and name in results:
        assert results[section.results]["measured_at"] in text


def test_committed_results_render_the_figures_they_hold():
    """The headline figures of whatever run is committed, formatted as the doc shows them
    (read from the JSON: a new `make bench` run changes the values, not this test)."""
    results = render_docs.load_results(RESULTS)
    rendered = render_all(results)
    env = results["envserver"]
    assert (
        f"| 64 | {env['steps_per_s_64']:,.0f} | {env['echo_steps_per_s_64']:,.0f} |"
        f" {env['ratio_vs_echo_64']:.2f} |" in rendered["envserver"]
    )
    actor = results["actor"]["ratio_vs_raw_vllm"]
    assert f"ratio_vs_raw_vllm: {actor:.2f} (target ≥ 0.90)" in rendered["actor"]
    speedup = results["async"]["speedup"]
    assert f"speedup (sync s per step / async): {speedup:.2f}x" in rendered["async"]
    peer = results["peer_trl"]
    row = (
        f"| 4 | {peer['trl_pass1_step04']:.3f} | {peer['trl_t_step04_s']:.0f} |"
        f" {peer['tether_pass1_step04']:.3f} | {peer['tether_t_step04_s']:.0f} |"
    )
    assert row in rendered["peer_trl"]
    assert f"from launch): {peer['ratio']:.2f}" in rendered["peer_trl"]


def test_a_missing_results_file_renders_as_not_measured():
    rendered = render_all({})
    assert rendered["transport"] == "_Not measured yet: run `make bench`._"
    assert "python -m bench.lora_parity" in rendered["lora_parity"]
    assert "| 7B (7.62B parameters) |" in rendered["projection-weights"]
    assert "k needed" in rendered["projection-staleness"]  # optional: its models still show


# --- target lines and provenance --------------------------------------------------------------


def test_a_target_line_says_met_or_missed_on_either_side_and_at_the_bound():
    assert check("r", 0.95, 0.95, ">=", fixed) == "- r: 0.95 (target ≥ 0.95): **met**"
    assert check("r", 0.94, 0.95, ">=", fixed).endswith("**missed**")
    assert check("idle", 0.1, 0.1, "<", fixed).endswith("**missed**")
    assert check("idle", 0.09, 0.1, "<", fixed).endswith("**met**")
    assert check("stall", 2.0, 2, "<=", fixed).endswith("**met**")
    assert check("stall", 2.5, 2, "<=", fixed).endswith("**missed**")
    assert check("r", None, 0.95, ">=", fixed) == "- r: — (target ≥ 0.95): not measured"


def test_provenance_shows_when_where_and_the_load():
    figures = {"measured_at": "T", "machine": "m", "load_avg_1m_before": 1.0}
    assert provenance(figures) == "_Measured T on m; (load average not recorded)._"
    figures["load_avg_1m_after"] = 2.25
    assert "load average 1.0 before and 2.2 after" in provenance(figures)
    assert "load average 11.9" in provenance({"measured_at": "T", "load_avg_1m": 11.94})


# --- each renderer on hand-made figures -------------------------------------------------------


@pytest.mark.parametrize(("e2e", "verdict"), [(6e6, "met"), (4e6, "missed")])
def test_transport(e2e, verdict):
    text = parts.transport({"e2e_tokens_per_s": e2e, "core_nats_tokens_per_s": 5e6, "ratio": 1.2})
    assert f"| Tether end to end, tokens/s | {e2e / 1e6:.1f} M |" in text
    assert f"(target ≥ 5.0 M tokens/s): **{verdict}**" in text


@pytest.mark.parametrize(("rate", "ratio", "verdicts"), [(2500, 0.8, 2), (1500, 0.6, 0)])
def test_envserver(rate, ratio, verdicts):
    figures = {"steps_per_s_64": rate, "echo_steps_per_s_64": 3000, "ratio_vs_echo_64": ratio}
    text = parts.envserver(figures)
    assert f"| 64 | {rate:,} | 3,000 | {ratio:.2f} |" in text
    assert text.count("**met**") == verdicts and text.count("**missed**") == 2 - verdicts


@pytest.mark.parametrize(("ratio", "verdict"), [(0.96, "met"), (0.94, "missed")])
def test_learner(ratio, verdict):
    text = parts.learner({"learner_tokens_per_s": 960, "bare_torch_tokens_per_s": 1000,
                          "ratio_vs_bare_torch": ratio})  # fmt: skip
    assert "| learner loop, tokens/s | 960 |" in text
    assert f"ratio_vs_bare_torch: {ratio:.3f} (target ≥ 0.950): **{verdict}**" in text


@pytest.mark.parametrize(("ratio", "verdict"), [(0.91, "met"), (0.89, "missed")])
def test_actor(ratio, verdict):
    figures = {
        "ratio_vs_raw_vllm": ratio,
        "round_ratios": "0.8 1.0",
        "actor_cpu_s_per_1k_tokens_engine": 1.0,
        "actor_cpu_s_per_1k_tokens_client": 0.1,
        "actor_cpu_s_per_1k_tokens_env": 0.05,
        "actor_cpu_s_per_1k_tokens_nats_server": 0.05,
        "episode_wall_s_mean": 10.0,
        "episode_env_s_mean": 0.5,
    }
    text = actor.actor(figures)
    assert f"| **{ratio:.2f}** (0.8 1.0) |" in text
    assert f"ratio_vs_raw_vllm: {ratio:.2f} (target ≥ 0.90): **{verdict}**" in text
    assert "is 20% of the engine's" in text  # (0.1 + 0.05 + 0.05) / 1.0
    assert "Env steps take 5.0% of an episode's wall time" in text


@pytest.mark.parametrize(("ratio", "verdict"), [(0.95, "met"), (0.85, "missed")])
def test_prefix_sharing(ratio, verdict):
    figures = {
        "unshared_tokens_per_s_ratio_8192_vs_1024": ratio,
        "budget": 8192,
        "demo_shared_step_s": 0.5,
        "demo_speedup_shared_vs_current": 4.0,
    }
    text = prefix.prefix_sharing(figures)
    assert "| demo | shared, 8,192 tokens | 0.50 |" in text
    assert "| demo | — / — | 4.00x |" in text
    assert text.endswith(f"(target ≥ 0.90): **{verdict}**\n\n_Measured at an unrecorded time"
                         " (load average not recorded)._")  # fmt: skip


@pytest.mark.parametrize(
    ("ratio", "stall_steps", "verdicts"), [(0.6, 1.5, ("met", "met")), (0.4, 3, ("missed",) * 2)]
)
def test_weightsync(ratio, stall_steps, verdicts):
    figures = {
        "ratio_vs_loopback": ratio,
        "ratio_vs_loopback_k1": ratio,
        "stall_in_decode_steps": stall_steps,
        "engine_pause_ms_k2": 30.0,
        "engine_receive_ms_k2": 300.0,
        "engine_load_ms_k2": 100.0,
        "loopback_bytes_per_s": 1.5e9,
    }
    text = system.weightsync(figures)
    assert "| engine's account: pause / receive / load, ms | — / — / — | 30 / 300 / 100 |" in text
    assert "| loopback, one TCP stream, MB/s | 1,500 |  |" in text
    assert f"(target ≥ 0.50): **{verdicts[0]}**" in text
    assert f"(target ≤ 2.0): **{verdicts[1]}**" in text


def test_async_targets_on_both_sides():
    fast = {"speedup": 3.0, "learner_idle_frac": 0.05, "actor_idle_frac": 0.05}
    slow = {"speedup": 1.2, "learner_idle_frac": 0.2, "actor_idle_frac": 0.1}
    assert system.async_speedup(fast).count("**met**") == 3
    assert system.async_speedup(slow).count("**missed**") == 3
    both = {"sync_train_s_per_step": 1.0, "async_train_s_per_step": 2.5, "sync_s_per_step": 5.0}
    text = system.async_speedup(both)
    assert "| seconds per step | 5.00 | — |" in text
    assert "(the same step with the engines generating beside it): 2.50x" in text


def test_async_gpu_model_shows_its_terms():
    figures = {
        "sync_wait_data_s_per_step": 3.0,
        "sync_train_s_per_step": 1.25,
        "sync_broadcast_s_per_step": 0.25,
        "sync_engine_busy_s_per_step": 1.0,
        "model_gpu_sync_s_per_step": 4.5,
        "model_gpu_async_s_per_step": 1.5,
        "model_gpu_speedup": 3.0,
        "model_gpu_learner_idle_frac": 0.0,
        "model_gpu_actor_idle_frac": 1 / 3,
    }
    text = system.async_gpu_model(figures)
    assert "G = 3.00 s, T = 1.50 s, E = 1.00 s per step" in text
    assert "**Modelled speedup 3.00x**; learner idle 0%, engines idle 33%" in text
    assert "missing" in system.async_gpu_model({})


def _staleness_figures(none_k2: float) -> dict:
    figures = {"eval_prompts": 100, "eval_samples": 2}
    for k, none in ((0, 0.9), (2, none_k2)):
        for correction, mean in (("none", none), ("tis", 0.9), ("decoupled", 0.9)):
            for stat, value in (("mean", mean), ("std", 0.01), ("min", mean), ("max", mean)):
                figures[f"pass1_k{k}_{correction}_{stat}"] = value
    return figures


def test_staleness_table_and_readings():
    figures = _staleness_figures(none_k2=0.8)
    figures["pass1_k2_decoupled_mean"] = 0.85
    text = system.staleness(figures)
    assert "| 2 | 0.800 ± 0.010 [0.800, 0.800] | 0.900 ± 0.010" in text
    assert "none (PPO vs behaviour): largest loss against k = 0: 0.100." in text
    assert "TIS and decoupled PPO differ in 1 of 2 rows (k = 2)." in text
    assert f"= {math.sqrt(0.9 * 0.1 / 200):.3f}." in text  # 0.021
    assert "differ in 0 of 2 rows." in system.staleness(_staleness_figures(none_k2=0.8))


def _peer_figures(ratio: float) -> dict:
    return {
        "ratio": ratio,
        "target_pass1": 0.8,
        "pass1_start": 0.5,
        "trl_pass1_step02": 0.85,
        "trl_t_step02_s": 20.0,
        "tether_pass1_step02": 0.7,
        "tether_t_step02_s": 150.0,
        "tether_inrun_pass1_v05": 0.75,
        "trl_time_to_pass1_0p8_s": 20.0,
        "tether_startup_s": 140.0,
        "trl_per_step_s": 3.0,
        "trl_generate_per_step_s": 2.0,
        "trl_train_per_step_s": 1.0,
        "tether_per_step_s": 5.0,
        "tether_train_per_step_s": 4.0,
        "tether_new_part_per_step_s": 1.0,
        "tether_engine_busy_per_step_s": 2.5,
        "tether_learner_wait_frac": 0.02,
    }


@pytest.mark.parametrize(("ratio", "verdict"), [(0.4, "met"), (7.7, "missed")])
def test_peer_trl(ratio, verdict):
    text = peer.peer_trl(_peer_figures(ratio))
    assert "| 0 | 0.500 | — | 0.500 | — | — |" in text
    assert "| 2 | 0.850 | 20 | 0.700 | 150 | — |" in text
    assert "| 5 | — | — | — | — | 0.750 |" in text
    assert f"from launch): {ratio:.2f} (target ≤ 0.50): **{verdict}**" in text
    assert "within 10 s of launch; its start-up alone took 140 s, above that." in text
    # every *_per_step_s key is a part of the step, new ones included; engine busy is not
    assert "| Tether | new part | 1.00 |" in text and "| Tether | sum of the parts | 5.00 |" in text
    assert "engine busy" not in text.split("| side |")[1].split("\n\n")[0]
    assert "waited for data 2.0% of the time: the learner is the bottleneck" in text


@pytest.mark.parametrize(("equal", "verdict"), [(30, "met"), (29, "missed")])
def test_lora_parity(equal, verdict):
    figures = {"prompts": 30, "vllm_lora_prompts_equal": equal, "merged_prompts_equal": 30}
    text = parts.lora_parity(figures)
    assert f"| vLLM's LoRA | {equal} of 30 |" in text
    assert f"{equal} of 30 (target: all): **{verdict}**" in text


def test_lora_sync_and_weight_group_tables():
    sync = parts.lora_sync({"vllm_lora_full_stall_ms": 200.0, "vllm_lora_adapter_stall_ms": 50.0,
                            "vllm_lora_adapter_over_full_stall": 0.25})  # fmt: skip
    assert "| stall, vLLM's LoRA (ms) | 200.0 | 50.0 | 0.25 |" in sync
    group = parts.weight_group({"saved_per_update_ms": 70.0, "fresh_over_long_lived": 2.0})
    assert "| saved per update | 70.0 ms |" in group and "| 2.00x |" in group


def test_engine_update_memory_counts_growth_in_the_largest_bucket():
    text = parts.engine_update_memory(
        {"streamed_growth_mb": 1200.0, "streamed_growth_largest_buckets": 2.0,
         "receive_only_growth_largest_buckets": 1.0, "staged_growth_largest_buckets": 5.5}
    )  # fmt: skip
    assert "| streamed engine (the default) | 1,200 | 2.00 | — |" in text
    streamed = "streamed engine (the default), largest buckets: 2.0000 (target ≤ 2.0000)"
    assert f"{streamed}: **met**" in text
    assert "| staged engine | — | 5.50 | — |" in text


# --- make bench's costs --------------------------------------------------------------------


def test_make_bench_summarises_the_runners_timings():
    figures = runner.summarise([("actor", 300.0, 1.5, 2.0), ("async", 240.0, 2.0, 3.5)])
    assert figures == {
        "scripts": "actor async",
        "actor_s": 300.0,
        "actor_load_avg_1m_before": 1.5,
        "actor_load_avg_1m_after": 2.0,
        "async_s": 240.0,
        "async_load_avg_1m_before": 2.0,
        "async_load_avg_1m_after": 3.5,
        "total_s": 540.0,
        "load_avg_1m_before": 1.5,
        "load_avg_1m_after": 3.5,
    }
    with pytest.raises(ValueError, match="no benchmark ran"):
        runner.summarise([])


@pytest.mark.parametrize(("total_s", "verdict"), [(30 * 60, "met"), (50 * 60, "missed")])
def test_make_bench_costs(total_s, verdict):
    figures = runner.summarise([("actor", float(total_s), 1.0, 2.0)])
    text = costs.make_bench(figures)
    assert f"| `bench/actor.py` | {total_s / 60:.1f} min | 1.0 → 2.0 |" in text
    assert f"(target ≤ 45.0 min): **{verdict}**" in text


# --- the projection's arithmetic ------------------------------------------------------------


def test_projection_step_time_and_broadcast():
    # 6 x 7.62e9 x 512 x 4096 FLOP over 8 x 989e12 x 0.4 FLOP/s
    assert projection.step_s(7.62e9) == pytest.approx(6 * 7.62e9 * 2097152 / 3.1648e15)
    assert projection.step_s(7.62e9) == pytest.approx(30.3, abs=0.1)
    assert projection.inter_node_gb_s() == 40.0
    text = projection.weights({})
    assert "| 7B (7.62B parameters) | 15.2 GB | 0.38 s | 0.051 s | 30 s |" in text


def test_projection_slowest_of_a_group_and_the_bound():
    tail, z = projection.slowest_of(8, 0.05, 2.0)
    assert z == pytest.approx(3.02, abs=0.01)  # the 0.99^(1/8) quantile
    assert tail == pytest.approx(6.0, abs=0.05)
    assert projection.slowest_of(1, 0.05, 2.0)[0] == pytest.approx(2.0)  # one call: its p99
    assert projection.staleness_needed(8.0, 4.0) == 1  # exactly two step times
    assert projection.staleness_needed(8.1, 4.0) == 2
    assert projection.staleness_needed(1.0, 4.0) == 0
    text = projection.staleness({"async_s_per_step": 4.0})
    assert "| 4.0 s | 2 s generation + 6.0 s tool tail | 2 |" in text


# --- markers ---------------------------------------------------------------------------------

DOC_TWO = """intro
<!-- figures:a -->
old a
<!-- /figures:a -->
middle
<!-- figures:b -->
<!-- /figures:b -->
end
"""


def test_replacing_blocks_rewrites_only_their_content_and_is_idempotent():
    once = replace_blocks(DOC_TWO, {"a": "new a", "b": "| t |"})
    assert once == DOC_TWO.replace("old a\n", "\nnew a\n\n").replace(
        "<!-- figures:b -->\n", "<!-- figures:b -->\n\n| t |\n\n"
    )
    assert replace_blocks(once, {"a": "new a", "b": "| t |"}) == once
    assert outside_blocks(once) == outside_blocks(DOC_TWO)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (DOC_TWO + "<!-- figures:c -->\n<!-- /figures:c -->\n", "unknown figures markers"),
        (DOC_TWO.replace("<!-- figures:b -->\n<!-- /figures:b -->\n", ""), "missing figures"),
        (DOC_TWO.replace("<!-- /figures:b -->", ""), "never closed"),
        (DOC_TWO.replace("<!-- /figures:a -->\n", ""), "opens inside"),
        (DOC_TWO.replace("<!-- figures:a -->", ""), "closes a block that is not open"),
        (DOC_TWO + "<!-- figures:a -->\n<!-- /figures:a -->\n", "more than once"),
    ],
)
def test_bad_markers_are_clear_errors(doc, message):
    with pytest.raises(ValueError, match=message):
        replace_blocks(doc, {"a": "x", "b": "y"})


def test_render_docs_rewrites_a_doc_in_place(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "transport.json").write_text('{"ratio": 1.5, "measured_at": "T"}')
    doc = tmp_path / "doc.md"
    doc.write_text("".join(f"<!-- figures:{n} -->\n<!-- /figures:{n} -->\n" for n in SECTIONS))
    monkeypatch.setattr("sys.argv", ["render_docs", f"--results={results}", f"--doc={doc}"])
    render_docs.main()
    text = doc.read_text()
    assert "| **ratio** (Tether / core NATS) | 1.50 |" in text
    unmeasured = [
        name
        for name, section in SECTIONS.items()
        if section.results not in (None, "transport") and not section.optional
    ]
    assert text.count("_Not measured yet: run `") == len(unmeasured)
    out = capsys.readouterr().out
    assert "rendered transport" in out and "(missing)" in out


def test_a_section_without_results_renders_from_constants():
    assert render_section(Section(None, lambda f: f"n={len(f)}"), {"x": {}}) == "n=0"
