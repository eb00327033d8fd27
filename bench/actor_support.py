"""The pieces of bench/actor.py that are not the benchmark's flow: the scripted episode the
tiny model is taught, the requests read back from trajectories, the raw-vLLM replays of
them, the env server process, and CPU accounting of every process involved."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


SYSTEM = "You are a benchmark agent. Call the noop tool every turn."
NOOP_CALL = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
TURN_TEXT = "I will call the noop tool now, then read what it says.\n" + NOOP_CALL


@dataclass(frozen=True)
class Request:
    """One engine call the actor made: the context it generated from and how many tokens."""

    episode: str
    turn: int
    prompt_token_ids: list[int]
    num_tokens: int


def script(task_index: int, num_turns: int) -> list[dict]:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {task_index}"},
    ]
    for _ in range(num_turns):
        messages += [{"role": "assistant", "content": TURN_TEXT}, {"role": "tool", "content": "ok"}]
    return messages


def requests_of(trajectory) -> list[Request]:
    """Each turn's request, read back from a trajectory: a generated run of tokens (version
    != -1) after the prompt is one request whose prompt is everything before it."""
    from broker.codec import token_arrays

    arrays = token_arrays(trajectory)
    ids = arrays.token_ids.tolist()
    generated = (arrays.versions != -1).tolist()
    requests, start = [], None
    for position in range(trajectory.prompt_len, len(ids) + 1):
        inside = position < len(ids) and generated[position]
        if inside and start is None:
            start = position
        elif not inside and start is not None:
            num = position - start
            requests.append(Request(trajectory.trajectory_id, len(requests), ids[:start], num))
            start = None
    return requests


# ---- the env server process ---------------------------------------------------------------------


def start_env_server() -> tuple[subprocess.Popen, str]:
    from common.procs import free_port

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envservers.cli",
            "--env",
            "noop",
            "--port",
            str(port),
            "envserver.metrics_port=0",
            "envserver.log_level=WARNING",
        ],
        cwd=REPO,
    )
    return process, f"127.0.0.1:{port}"


async def wait_for_env_server(address: str, timeout_s: float = 60.0) -> None:
    from protos.client import EnvClient

    deadline = time.monotonic() + timeout_s
    async with EnvClient(address, timeout_s=2.0, max_retries=0) as client:
        while True:
            try:
                await client.list_envs()
                return
            except Exception:  # not listening yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)


# ---- where the CPU goes -------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


class CpuMeter:
    """CPU seconds used by each part: this process (the actor loop and the vLLM client),
    the env server, nats-server, and the vLLM engine (every other child of this process)."""

    def __init__(self, *, env_pid: int, nats_pid: int) -> None:
        self.named = {"client": os.getpid(), "env server": env_pid, "nats-server": nats_pid}

    def sample(self) -> dict[str, float]:
        used = {name: _cpu_seconds(pid) for name, pid in self.named.items()}
        others = set(_descendants(os.getpid())) - set(self.named.values())
        used["engine"] = sum(_cpu_seconds(pid) for pid in others)
        return used

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before.get(name, 0.0) for name in after}


# ---- phases -------------------------------------------------------------------------------------


def _rejected_tasks() -> float:
    """Prompt tasks this process's actor refused as malformed (actors/metrics.py's counter)."""
    import prometheus_client as prom

    value = prom.REGISTRY.get_sample_value("tether_actor_tasks_total", {"outcome": "rejected"})
    return value or 0.0


async def actor_phase(running: asyncio.Task, js, names, tasks, consumer):
    """Publish `tasks`; return the seconds until all their trajectories are stored (the
    actor publishes them), and those trajectories."""
    from broker import client as bus

    expected = sum(t.group_size for t in tasks)
    rejected = _rejected_tasks()
    before = (await js.stream_info(names.trajectories.stream)).state.messages
    started = time.perf_counter()
    await bus.publish_prompts(js, names, tasks)
    while (await js.stream_info(names.trajectories.stream)).state.messages < before + expected:
        if running.done():
            running.result()  # the actor failed: raise its error
            raise RuntimeError("the actor stopped before finishing the tasks")
        if _rejected_tasks() > rejected:  # never retried: waiting would hang the benchmark
            raise RuntimeError("the actor rejected a task (its reason is in the log above)")
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    trajectories = []
    while len(trajectories) < expected:
        for received in await consumer.fetch(batch=256, timeout_s=1.0):
            trajectories.append(received.trajectory)
            await received.ack()
    return elapsed, trajectories


async def raw_generate(llm, request: Request) -> float:
    """Generate exactly the request's tokens; returns the seconds it was in the engine."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(
        temperature=1.0,
        max_tokens=request.num_tokens,
        ignore_eos=True,  # exactly the actor's count, EOS or not
        logprobs=0,  # the actor asks for the sampled token's logprob too
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    final = None
    started = time.perf_counter()
    async for output in llm.generate(
        {"prompt_token_ids": request.prompt_token_ids}, params, uuid.uuid4().hex
    ):
        final = output
    num = len(final.outputs[0].token_ids)
    assert num == request.num_tokens, (num, request.num_tokens)
    return time.perf_counter() - started


async def raw_by_turn(llm, requests: list[Request]) -> tuple[float, float]:
    """Each episode's turns in order, all episodes at once. Returns the wall seconds and
    the seconds requests spent in the engine, summed."""
    episodes: dict[str, list[Request]] = {}
    for request in requests:
        episodes.setdefault(request.episode, []).append(request)

    async def episode(turns: list[Request]) -> float:
        return sum([await raw_generate(llm, r) for r in sorted(turns, key=lambda r: r.turn)])

    started = time.perf_counter()
    in_engine = await asyncio.gather(*(episode(turns) for turns in episodes.values()))
    return time.perf_counter() - started, sum(in_engine)


async def raw_offline(llm, requests: list[Request]) -> float:
    ordered = sorted(requests, key=lambda r: r.turn)
    started = time.perf_counter()
    pending = []
    for request in ordered:  # created in order: the engine receives them in this order
        pending.append(asyncio.ensure_future(raw_generate(llm, request)))
    await asyncio.gather(*pending)
    return time.perf_counter() - started


# ---- the run ------------------------------------------------------------------------------------
