"""Trajectory transport throughput: Tether's JetStream path vs core NATS, same bytes.

Two separate processes talk through a real embedded nats-server:
  ours:     TrajectoryPublisher.publish_many -> stream -> TrajectoryConsumer.fetch -> decode
            (msgspec + numpy views of the packed tokens) -> ack
  baseline: core NATS publish of the same encoded bytes -> plain subscriber (no decode,
            no persistence, no acks)
Throughput = tokens delivered / wall time from the start signal to the last message.
Writes bench/results/transport.json: e2e_tokens_per_s, core_nats_tokens_per_s, ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import time

from bench.common import Benchmark, load_average, print_table, write_results

BENCHMARK = Benchmark(
    measures="trajectory transport: the JetStream path against core NATS",
    target="bench",
    minutes=0.3,
)

SUBJECT_CORE = "bench.core"


def _trajectories(num: int, num_tokens: int):
    import numpy as np

    from broker.codec import pack_tokens
    from broker.wire import Trajectory

    rng = np.random.default_rng(0)
    mask = np.ones(num_tokens, np.uint8)
    mask[: num_tokens // 8] = 0
    packed = pack_tokens(
        token_ids=rng.integers(0, 150_000, num_tokens),
        logprobs=-rng.random(num_tokens),
        loss_mask=mask,
        versions=np.full(num_tokens, 3),
    )
    return [
        Trajectory(
            trajectory_id=f"traj-{i}",
            group_id=f"g{i // 8}",
            group_size=8,
            sample_index=i % 8,
            step=0,
            env_class="calculator",
            prompt_len=num_tokens // 8,
            reward=1.0,
            stop_reason="stop",
            num_turns=2,
            **packed,
        )
        for i in range(num)
    ]


async def _produce(url: str, namespace: str, mode: str, num: int, num_tokens: int, start) -> None:
    from broker import client
    from broker.codec import encode
    from broker.names import BusNames

    trajectories = _trajectories(num, num_tokens)
    nc = await client.connect(url, name=f"bench-producer-{mode}")
    start.wait()
    if mode == "core":
        for t in trajectories:
            await nc.publish(SUBJECT_CORE, encode(t))
        await nc.flush()
    else:
        publisher = client.TrajectoryPublisher(nc.jetstream(), BusNames(namespace))
        for i in range(0, num, 64):
            await publisher.publish_many(trajectories[i : i + 64])
    await nc.close()


async def _consume(url: str, namespace: str, mode: str, num: int, ready, start, out) -> None:
    from broker import client
    from broker.codec import token_arrays
    from broker.names import BusNames

    nc = await client.connect(url, name=f"bench-consumer-{mode}")
    num_tokens = 0
    if mode == "core":
        done = asyncio.Event()
        count = 0

        async def on_msg(msg):
            nonlocal count, num_tokens
            count += 1
            num_tokens += len(msg.data) // 13  # approximate; tokens are counted exactly below
            if count == num:
                done.set()

        await nc.subscribe(SUBJECT_CORE, cb=on_msg, pending_bytes_limit=-1, pending_msgs_limit=-1)
        await nc.flush()
        ready.set()
        start.wait()
        t0 = time.perf_counter()
        await done.wait()
    else:
        consumer = client.TrajectoryConsumer(nc.jetstream(), BusNames(namespace))
        await consumer.fetch(batch=1, timeout_s=0.1)  # bind the subscription before the clock
        ready.set()
        start.wait()
        t0 = time.perf_counter()
        count = 0
        while count < num:
            for received in await consumer.fetch(batch=256, timeout_s=1.0):
                num_tokens += len(token_arrays(received.trajectory).token_ids)
                await received.ack()
                count += 1
    out.put((time.perf_counter() - t0, count))
    await nc.close()


def _producer_main(*args):
    asyncio.run(_produce(*args))


def _consumer_main(*args):
    asyncio.run(_consume(*args))


def measure(url: str, namespace: str, mode: str, num: int, num_tokens: int) -> float:
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Event(), ctx.Event(), ctx.Queue()
    consumer = ctx.Process(
        target=_consumer_main, args=(url, namespace, mode, num, ready, start, out)
    )
    producer = ctx.Process(
        target=_producer_main, args=(url, namespace, mode, num, num_tokens, start)
    )
    consumer.start()
    producer.start()
    assert ready.wait(60), "consumer did not get ready"
    time.sleep(2.0)  # let the producer build its trajectories before the clock starts
    start.set()
    elapsed, count = out.get(timeout=600)
    producer.join(60)
    consumer.join(60)
    assert count == num, f"{mode}: delivered {count} of {num}"
    return num * num_tokens / elapsed


async def _setup(url: str, namespace: str) -> None:
    from broker import client
    from broker.names import BusNames

    nc = await client.connect(url, name="bench-setup")
    await client.ensure_streams(nc.jetstream(), BusNames(namespace))
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per trajectory")
    parser.add_argument("--repeats", type=int, default=2, help="best of N per mode")
    args = parser.parse_args()

    from broker.server import NatsServer

    with (
        load_average() as loads,
        tempfile.TemporaryDirectory() as store,
        NatsServer(store) as server,
    ):
        core, ours = [], []
        for r in range(args.repeats):
            namespace = f"bench{r}"
            asyncio.run(_setup(server.url, namespace))
            core.append(measure(server.url, namespace, "core", args.trajectories, args.tokens))
            ours.append(measure(server.url, namespace, "jetstream", args.trajectories, args.tokens))
    figures = {
        "e2e_tokens_per_s": max(ours),
        "core_nats_tokens_per_s": max(core),
        "ratio": max(ours) / max(core),
        "trajectories": args.trajectories,
        "tokens_per_trajectory": args.tokens,
        "message_bytes": args.tokens * 13,
        "repeats": args.repeats,
        **loads,
    }
    print_table(
        "transport: publish -> fetch -> decode -> ack, separate processes",
        [
            ("tokens per trajectory", args.tokens),
            ("trajectories per run", args.trajectories),
            ("Tether e2e (M tokens/s)", max(ours) / 1e6),
            ("core NATS (M tokens/s)", max(core) / 1e6),
            ("ratio (ours / core NATS)", figures["ratio"]),
        ],
    )
    write_results("transport", figures)


if __name__ == "__main__":
    main()
