"""The pure half of bench/profile_steps.py: py-spy's raw samples of a whole `make run`
(every process, `--subprocesses`) sorted into the role of the process they came from and
a category of work, by the frames on their stack.

A raw line is `frame;frame;...;frame COUNT`, outermost first; with `--subprocesses` the
first frames are the process chain, each `process PID:"COMMAND LINE"`. Only threads that
were running are sampled (no `--idle`), so a category's samples / rate is the time a Python
thread of that role spent in it; what a role does not spend running is waiting.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

OTHER = "other"
WAITING = "waiting (select, poll, locks)"
"""A thread blocked in a wait that py-spy still sampled (`--nonblocking` cannot always tell):
not work. Every other category is work."""
WAIT_LEAVES = (
    "Selector.select (",
    "Condition.wait (",
    "Event.wait (",
    "Queue.get (",
    "serve_forever (",
    "_worker (concurrent/futures/thread.py",
)
"""Innermost frames that mean the thread was waiting (matched on the innermost frame only:
a pool thread running work has `_worker` further out)."""
SPIN = "spin-waiting for the next step (shm queue)"
"""vLLM's multiprocessing executor: the worker polls a shared-memory queue for the
scheduler's next step, yielding the core but never sleeping (work, not a wait)."""

# (role, what its command line holds), first match wins: the innermost process frame is
# matched first, then its parents (a replica is a spawned child of the actor launcher).
ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine", ("VLLM::", "EngineCore", "VllmWorker")),
    ("learner", ("learner.cli",)),
    ("envserver", ("envservers.cli",)),
    ("(untracked)", ("resource_tracker",)),
    ("actor", ("actors.cli",)),
    ("launcher", ("deploy.local",)),
)

# Per role: (category, frame substrings), the first category with a frame matching wins.
# Frames look like `function (path/relative/to/site-packages.py:line)`.
CATEGORIES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "learner": (
        ("evals", ("learner/evals.py",)),
        (
            "checkpoint and snapshot",
            ("learner/trainer/checkpoint.py", "distributed/checkpoint/", "snapshot"),
        ),
        ("weight broadcast", ("weights/", "weight_sync", "weight_buckets", "publish_weights")),
        ("backward", ("_engine_run_backward", "autograd/__init__.py", "backward (torch/")),
        ("optimizer", ("torch/optim/", "clip_grad")),
        ("forward", ("forward (", "compute_logprobs", "_logprobs")),
        (
            "batching and packing",
            ("learner/batching.py", "learner/trainer/segments.py", "prefix_plan"),
        ),
        ("taking groups (bus, decoding)", ("learner/intake.py", "nats/", "msgspec", "_take")),
        ("metrics and logging", ("prometheus_client", "wandb", "reporting.py", "sinks.py")),
    ),
    "actor": (
        ("weight update", ("weights/", "update_weights", "actors/snapshots.py", "wait_round")),
        ("env calls (gRPC)", ("grpc", "protos/client.py", "env_retry")),
        ("chat template, tokenizer", ("actors/chat.py", "tokenizers", "transformers/")),
        ("vLLM client", ("vllm/",)),
        ("bus (NATS)", ("nats/", "broker/", "msgspec")),
        ("episode logic", ("actors/episode.py", "actors/trajectory.py", "actors/actor.py")),
    ),
    "engine": (
        (SPIN, ("SpinCondition", "acquire_read")),
        ("weight receive and reload", ("weights/", "reload_weights", "model_loader/reload/")),
        ("model forward", ("model_executor/", "forward (")),
        ("sampling", ("v1/sample/",)),
        ("scheduling", ("v1/core/",)),
        ("engine loop, IPC", ("v1/engine/", "zmq", "shm_broadcast", "msgspec")),
    ),
}


def parse_raw(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """(frames outermost first, count) per line of py-spy's raw format."""
    samples = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack.split(";"), int(count)))
    return samples


def role_of(frames: list[str]) -> str:
    """The role of the process a sample came from, by its process chain."""
    chain = [frame for frame in frames if frame.startswith("process ")]
    for process in reversed(chain):
        for role, marks in ROLES:
            if any(mark in process for mark in marks):
                return role
    return OTHER


def category_of(role: str, frames: list[str]) -> str:
    if role in CATEGORIES and frames and any(leaf in frames[-1] for leaf in WAIT_LEAVES):
        return WAITING
    for category, marks in CATEGORIES.get(role, ()):
        if any(mark in frame for frame in frames for mark in marks):
            return category
    return OTHER


def profile(samples: list[tuple[list[str], int]]) -> dict[str, dict[str, int]]:
    """Samples by role, then by category."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for frames, count in samples:
        role = role_of(frames)
        code = [frame for frame in frames if not frame.startswith("process ")]
        table[role][category_of(role, code)] += count
    return {role: dict(categories) for role, categories in table.items()}


def per_step(
    table: dict[str, dict[str, int]], *, rate_hz: float, steps: float
) -> dict[str, dict[str, float]]:
    """Seconds of running Python threads per training step, by role and category."""
    if steps <= 0:
        raise ValueError("no training step finished inside the profiled window")
    return {
        role: {category: n / rate_hz / steps for category, n in categories.items()}
        for role, categories in table.items()
    }


def mean_step_s(records: list[dict]) -> float:
    """The mean time between the learner's step records, on its own clock (`wall_s`) where
    every record has it, else on the watcher's: a window holds a fraction of a step too."""
    if len(records) < 2:
        raise RuntimeError("fewer than two steps inside the window: make it longer")
    clock = "wall_s" if all("wall_s" in r for r in records) else "t"
    return (records[-1][clock] - records[0][clock]) / (len(records) - 1)
