"""The one runner of the benchmarks. Every module of bench/ that measures something declares
itself (bench/common.py's `Benchmark`):

    BENCHMARK = Benchmark(measures="...", target="bench", minutes=3)

with literal arguments, so that the runner reads the declarations from the files without
importing them (a benchmark's imports are heavy: torch, vLLM). A module without one is a
helper, never run as a benchmark.

    python -m bench.runner list          every benchmark: name, target, minutes, what it measures
    python -m bench.runner run bench     each of the target's, in name order (wall seconds and
                                         the 1-minute load before and after each go to
                                         bench/results/make_bench.json), then the docs' figures
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import TARGETS, Benchmark, write_results

BENCH_DIR = Path(__file__).resolve().parent
Timing = tuple[str, float, float, float]
"""A benchmark run: its name, wall seconds, the 1-minute load average before and after."""


def declaration(source: str, where: str = "<source>") -> Benchmark | None:
    """The `BENCHMARK = Benchmark(...)` a module's source makes at its top level, or None.
    ValueError when it is there but not made of literal keyword arguments."""
    for node in ast.parse(source, where).body:
        if not (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["BENCHMARK"]
        ):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Benchmark"):
            raise ValueError(f"{where}: BENCHMARK must be Benchmark(...)")
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except ValueError:
            raise ValueError(f"{where}: Benchmark(...) takes literal keyword arguments") from None
        if call.args or None in arguments:
            raise ValueError(f"{where}: Benchmark(...) takes keyword arguments only")
        return Benchmark(**arguments)
    return None


def declared(directory: Path = BENCH_DIR) -> dict[str, Benchmark]:
    """Every benchmark of `directory`, by module name, in name order."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        benchmark = declaration(path.read_text(), str(path))
        if benchmark is not None:
            found[path.stem] = benchmark
    return found


def summarise(timings: list[Timing]) -> dict[str, float | str]:
    """The figures of make_bench.json: `scripts` (the names, in order), `<name>_s`,
    `<name>_load_avg_1m_before` / `_after`, `total_s`, and the load before the first and
    after the last."""
    if not timings:
        raise ValueError("no benchmark ran")
    figures: dict[str, float | str] = {"scripts": " ".join(name for name, *_ in timings)}
    for name, wall_s, before, after in timings:
        figures[f"{name}_s"] = wall_s
        figures[f"{name}_load_avg_1m_before"] = before
        figures[f"{name}_load_avg_1m_after"] = after
    figures["total_s"] = sum(wall_s for _, wall_s, _, _ in timings)
    figures["load_avg_1m_before"] = timings[0][2]
    figures["load_avg_1m_after"] = timings[-1][3]
    return figures


def run(target: str) -> None:
    """Each benchmark of `target` as `python -m bench.NAME`, timed; stops at the first that
    fails. For `bench` the times go to make_bench.json; then the docs are rendered."""
    names = [name for name, b in declared().items() if b.target == target]
    timings: list[Timing] = []
    for name in names:
        print(f"== bench/{name}.py", flush=True)
        before, started = os.getloadavg()[0], time.monotonic()
        subprocess.run([sys.executable, "-m", f"bench.{name}"], check=True)
        took = round(time.monotonic() - started)
        timings.append((name, float(took), before, os.getloadavg()[0]))
        print(f"== bench/{name}.py took {took} s", flush=True)
    if target == "bench":
        write_results("make_bench", summarise(timings))
    subprocess.run([sys.executable, "-m", "bench.render_docs"], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every declared benchmark")
    runs = commands.add_parser("run", help="every benchmark of a make target")
    runs.add_argument("target", choices=[t for t in TARGETS if t != "by hand"])
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.target)
        return
    for name, b in declared().items():
        cost = f"~{b.minutes:g} min"
        print(f"{name:<22} {b.target:<14} {cost:<10} {b.measures}")


if __name__ == "__main__":
    main()
