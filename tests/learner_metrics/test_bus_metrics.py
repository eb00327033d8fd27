"""learner/bus_metrics.py: JetStream's stream and consumer info become the tether_bus_*
gauges. The mapping on answers shaped like the server's; the reads and the poll against a
real nats-server, where every count is set up by hand (published, taken, nacked)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.js.api import ConsumerInfo, StreamInfo
from prometheus_client import REGISTRY

from broker import client
from broker.queue_depth import QueueDepth, queue_depth
from learner import bus_metrics, metrics
from tests.broker.builders import prompt_task

LIMITS = client.StreamLimits(max_trajectory_bytes=8 * 1024**2, max_prompt_msgs=100)


def _stream(*, messages: int, num_bytes: int, max_msgs: int, max_bytes: int) -> StreamInfo:
    return StreamInfo.from_response(
        {
            "config": {"name": "run_TRAJECTORIES", "max_msgs": max_msgs, "max_bytes": max_bytes},
            "state": {"messages": messages, "bytes": num_bytes, "first_seq": 4,
                      "last_seq": 9, "consumer_count": 1},
        }
    )  # fmt: skip


def _consumer(*, pending: int, ack_pending: int, redelivered: int) -> ConsumerInfo:
    return ConsumerInfo.from_response(
        {"name": "learner", "stream_name": "run_TRAJECTORIES", "config": {},
         "created": "2025-01-01T00:00:00Z", "num_pending": pending,
         "num_ack_pending": ack_pending, "num_redelivered": redelivered, "num_waiting": 1}
    )  # fmt: skip


def _gauge(name: str, queue: str) -> float | None:
    return REGISTRY.get_sample_value(f"tether_bus_{name}", {"queue": queue})


def test_queue_depth_reads_the_consumer_counts_and_the_stream_state():
    depth = queue_depth(
        _stream(messages=6, num_bytes=6144, max_msgs=-1, max_bytes=8192),
        _consumer(pending=2, ack_pending=4, redelivered=1),
    )
    assert depth == QueueDepth(
        pending=2, ack_pending=4, redelivered=1, messages=6, bytes=6144,
        max_messages=None, max_bytes=8192,
    )  # fmt: skip


def test_an_empty_queue_and_a_stream_without_limits():
    # -1 is JetStream's "unlimited"; a fresh consumer may leave the counts out (nats-py: None).
    depth = queue_depth(
        _stream(messages=0, num_bytes=0, max_msgs=-1, max_bytes=-1),
        ConsumerInfo.from_response(
            {"name": "c", "stream_name": "s", "config": {}, "created": "2025-01-01T00:00:00Z"}
        ),
    )
    assert depth == QueueDepth(0, 0, 0, 0, 0, max_messages=None, max_bytes=None)


def test_record_bus_sets_one_series_per_queue_and_none_for_no_limit():
    limited = QueueDepth(3, 1, 0, messages=4, bytes=4000, max_messages=100, max_bytes=10_000)
    metrics.record_bus({"unit-a": limited, "unit-b": QueueDepth(0, 0, 0, 0, 0, None, None)})
    assert _gauge("pending_messages", "unit-a") == 3.0
    assert _gauge("ack_pending_messages", "unit-a") == 1.0
    assert _gauge("stream_bytes", "unit-a") == 4000.0
    assert _gauge("stream_max_bytes", "unit-a") == 10_000.0
    assert _gauge("stream_max_messages", "unit-a") == 100.0
    assert _gauge("stream_messages", "unit-b") == 0.0
    assert _gauge("stream_max_bytes", "unit-b") is None  # unlimited: no series at all
    # A limit that is lifted takes its series with it.
    metrics.record_bus({"unit-a": QueueDepth(0, 0, 0, 0, 0, max_messages=100, max_bytes=None)})
    assert _gauge("stream_max_bytes", "unit-a") is None
    assert _gauge("stream_max_messages", "unit-a") == 100.0


@pytest.fixture
async def bus(nats_server, bus_names):
    nc = await client.connect(nats_server.url, name="test")
    js = nc.jetstream()
    yield js, bus_names
    await nc.close()


async def test_read_depths_counts_what_was_published_taken_and_nacked(bus):
    js, names = bus
    await client.ensure_streams(js, names, LIMITS)
    puller = client.PromptPuller(js, names)
    await client.publish_prompts(js, names, [prompt_task(task_id=f"p{i}") for i in range(2)])
    [first, _] = await puller.fetch(batch=2)
    await first.nak()  # back at once, and the only one to deliver: it comes a second time
    [again] = await puller.fetch(batch=1)
    assert again.task.task_id == first.task.task_id and again.num_delivered == 2
    await client.publish_prompts(js, names, [prompt_task(task_id=f"p{i}") for i in range(2, 5)])
    for i in range(3):
        await js.publish(names.trajectories.subject, b"x" * 1000, headers={"Nats-Msg-Id": f"t{i}"})

    depths = await bus_metrics.read_depths(js, names)

    # 5 prompts: 3 never delivered, 2 taken (unacked), one of them delivered twice.
    prompts = depths["prompts"]
    assert (prompts.pending, prompts.ack_pending, prompts.redelivered) == (3, 2, 1)
    assert prompts.messages == 5 and prompts.bytes > 0
    assert (prompts.max_messages, prompts.max_bytes) == (100, None)
    # 3 trajectories of 1000 bytes each, none fetched; the stream counts headers too.
    trajectories = depths["trajectories"]
    assert (trajectories.pending, trajectories.ack_pending, trajectories.redelivered) == (3, 0, 0)
    assert trajectories.messages == 3 and 3000 < trajectories.bytes < 3600
    assert (trajectories.max_messages, trajectories.max_bytes) == (None, 8 * 1024**2)


async def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_poll_outlives_missing_streams_and_records_once_they_exist(bus, caplog):
    js, names = bus
    caplog.set_level(logging.INFO, logger="learner.bus_metrics")
    metrics.record_bus({"prompts": QueueDepth(7, 7, 7, 7, 7, None, None)})  # an older run's
    task = asyncio.create_task(bus_metrics.poll(js, names, interval_s=0.05))
    try:
        await asyncio.sleep(0.3)  # several rounds without streams: skipped, not fatal
        assert not task.done()
        assert _gauge("pending_messages", "prompts") == 7.0  # last values kept
        await client.ensure_streams(js, names, LIMITS)
        await client.publish_prompts(js, names, [prompt_task(task_id="p0")])
        await _until(lambda: _gauge("pending_messages", "prompts") == 1.0)
        assert _gauge("stream_max_messages", "prompts") == 100.0
        assert _gauge("stream_max_bytes", "trajectories") == 8 * 1024**2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot read the queue depths" in warnings[0].message
    assert any("readable again" in r.message for r in caplog.records)
