"""Env server overhead: steps/s and latency of a no-op tool step, beside a bare gRPC echo.

Two server processes, measured one after the other with the same load generator:
  ours:     envserver hosting `noop` — session lookup and lock, tool-call parsing, argument
            check, dispatch, metadata JSON, Prometheus metrics, per step
  baseline: a bare grpc.aio servicer of the same proto whose Step returns a fixed reply
            (same channel options, same message sizes)
The load generator (this process) runs N concurrent sessions, each stepping in a closed loop
through protos.client (deadlines on, as actors use it), for 1, 16 and 64 sessions.
Writes bench/results/envserver.json: steps_per_s_{1,16,64}, p50_ms_*, p99_ms_*,
echo_steps_per_s_*, ratio_vs_echo_*. Target: >= 2,000 steps/s and ratio >= 0.7 at 64.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Benchmark, load_average, print_table, write_results
from common.procs import free_port

BENCHMARK = Benchmark(
    measures="env server overhead: a no-op tool step beside a bare gRPC echo",
    target="bench",
    minutes=0.3,
)

REPO = Path(__file__).resolve().parents[1]

NOOP_CALL = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
CONCURRENCY = (1, 16, 64)


async def serve_echo(port: int) -> None:
    import grpc

    from protos import env_pb2, env_pb2_grpc
    from protos.channel import server_options

    reply = env_pb2.StepResponse(
        observations=[env_pb2.ChatMessage(role="tool", content="ok")],
        metadata_json='{"num_tool_calls": 1, "tool_errors": 0, "turns": 1}',
    )

    class Echo(env_pb2_grpc.EnvServiceServicer):
        async def Reset(self, request, context):
            return env_pb2.ResetResponse(session_id=request.session_id, metadata_json="{}")

        async def Step(self, request, context):
            return reply

    server = grpc.aio.server(options=server_options())
    env_pb2_grpc.add_EnvServiceServicer_to_server(Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def serve_ours(port: int) -> None:
    from envservers.config import EnvServerConfig
    from envservers.server import EnvServer

    config = EnvServerConfig(port=port, envs=["noop"], metrics_port=None, log_level="WARNING")
    async with EnvServer(config):
        print("ready", flush=True)
        await asyncio.Event().wait()


async def load(address: str, sessions: int, seconds: float) -> tuple[float, list[float]]:
    """Closed-loop load: returns (steps/s, per-step latencies in s)."""
    from protos.client import EnvClient

    async with EnvClient(address, timeout_s=30, max_retries=0) as client:
        opened = await asyncio.gather(*(client.open("noop", {}) for _ in range(sessions)))
        for s in opened:  # warm-up
            await s.step(NOOP_CALL)
        latencies: list[float] = []
        stop_at = time.perf_counter() + seconds

        async def worker(session) -> None:
            while (now := time.perf_counter()) < stop_at:
                await session.step(NOOP_CALL)
                latencies.append(time.perf_counter() - now)

        start = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in opened))
        elapsed = time.perf_counter() - start
        return len(latencies) / elapsed, latencies


def measure(kind: str, seconds: float) -> dict[int, tuple[float, float, float]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.envserver", "--serve", kind, "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", f"{kind} server did not start"
        results = {}
        for n in CONCURRENCY:
            rate, latencies = asyncio.run(load(f"127.0.0.1:{port}", n, seconds))
            q = statistics.quantiles(latencies, n=100)
            results[n] = (rate, q[49] * 1000, q[98] * 1000)
        return results
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["echo", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement per point")
    args = parser.parse_args()
    if args.serve == "echo":
        asyncio.run(serve_echo(args.port))
        return 0
    if args.serve == "ours":
        asyncio.run(serve_ours(args.port))
        return 0

    with load_average() as loads:
        echo = measure("echo", args.seconds)
        ours = measure("ours", args.seconds)
    figures: dict[str, float | int | str] = {}
    rows = []
    for n in CONCURRENCY:
        rate, p50, p99 = ours[n]
        echo_rate, echo_p50, echo_p99 = echo[n]
        figures.update(
            {
                f"steps_per_s_{n}": rate,
                f"p50_ms_{n}": p50,
                f"p99_ms_{n}": p99,
                f"echo_steps_per_s_{n}": echo_rate,
                f"echo_p50_ms_{n}": echo_p50,
                f"echo_p99_ms_{n}": echo_p99,
                f"ratio_vs_echo_{n}": rate / echo_rate,
            }
        )
        rows += [
            (f"sessions={n:<3} envserver steps/s", rate),
            (f"sessions={n:<3} echo steps/s", echo_rate),
            (f"sessions={n:<3} ratio vs echo", rate / echo_rate),
            (f"sessions={n:<3} p50 / p99 ms", f"{p50:.2f} / {p99:.2f}"),
            (f"sessions={n:<3} echo p50 / p99 ms", f"{echo_p50:.2f} / {echo_p99:.2f}"),
        ]
    figures["seconds_per_point"] = args.seconds
    figures.update(loads)
    print_table("env server: no-op tool step vs bare grpc.aio echo", rows)
    write_results("envserver", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
