"""How many processes a CPU vLLM engine starts: two, not three.

On CPU vLLM's AsyncLLM spawns an engine-core process and, to bind the model's OpenMP
threads, always gives that process a multiprocessing executor that spawns the one worker as
a third process. Each of the two spawns imports vllm and torch again: on a 2-core machine
with a learner starting beside it, the third process alone costs about 10 s of start-up
(measured back to back: engine start 28.2 s -> 17.3-18.6 s, generation 4,300 -> 4,700
tokens/s; docs/actors.md).

vLLM keeps the worker inside the engine-core process (its uni-process executor) when
`VLLM_ENABLE_V1_MULTIPROCESSING=0`; what it would lose is the thread binding the worker
process got from its environment. So the engine-core process is given that same
environment when it is spawned (OpenMP thread count, places and binding: what vLLM's
`OMPProcessManager` sets for its worker), and the model runs on the same cores as before.

GPU engines, engines of several workers (tensor or pipeline parallel) and vLLM's own `auto`
binding keep vLLM's layout.

And how an engine's processes end: the engine core is given ENGINE_EXIT_GRACE_S, then killed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection


def parse_core_list(cores: str) -> list[int]:
    """ "0,2-3" -> [0, 2, 3], the format of VLLM_CPU_OMP_THREADS_BIND (one engine's list)."""
    ids: list[int] = []
    for part in cores.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"cpu_threads_bind: {cores!r} is not a core list like '0,2-3'")
        ids.extend(range(int(first), int(last or first) + 1))
    if not ids:
        raise ValueError(f"cpu_threads_bind: {cores!r} names no core")
    return ids


def in_core_worker_env(
    bind: str, *, num_workers: int, on_gpu: bool, usable_cores: Collection[int]
) -> dict[str, str] | None:
    """The environment under which the engine-core process runs the engine's only worker
    itself, its OpenMP threads placed as vLLM's worker process would place them; None where
    vLLM's own process layout stays (see the module docstring)."""
    if on_gpu or num_workers != 1 or bind == "auto":
        return None
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if bind == "nobind":
        # vLLM's worker would run torch's default: one thread per usable core.
        return env | {"OMP_NUM_THREADS": str(max(1, len(usable_cores)))}
    cores = parse_core_list(bind)
    return env | {
        "OMP_NUM_THREADS": str(len(cores)),
        "OMP_PLACES": "{" + ",".join(map(str, cores)) + "}",
        "OMP_PROC_BIND": "true",
    }


ENGINE_EXIT_GRACE_S = 0.5
"""How long a stopping engine's core process may take to exit before it is killed."""


class EngineKilledNotice(logging.Filter):
    """Drops vLLM's warning that it killed the engine core after the grace: with a grace
    shorter than the core's teardown it is said at every shutdown, and means nothing."""

    LOGGER = "vllm.v1.utils"

    def filter(self, record: logging.LogRecord) -> bool:
        return "force killing remaining process" not in str(record.msg)


_ENGINE_KILLED_NOTICE = EngineKilledNotice()


def shut_down(llm) -> None:
    """Stop vLLM's AsyncLLM `llm`: its engine core gets ENGINE_EXIT_GRACE_S to exit, then is
    killed. The core spends ~3 s (CPU) freeing its KV cache and weights and tearing torch
    down, all of which its exit frees anyway, and a stopping replica has 5 s in all
    (SIGTERM). Nothing of ours lives in it once its requests are done."""
    logging.getLogger(EngineKilledNotice.LOGGER).addFilter(_ENGINE_KILLED_NOTICE)
    llm.shutdown(timeout=ENGINE_EXIT_GRACE_S)


def threads_bind_for_replica(bind: str, replica_index: int, cores: list[int]) -> str:
    """The VLLM_CPU_OMP_THREADS_BIND value of one replica (`spread` resolved to a core)."""
    if bind != "spread":
        return bind
    if not cores:
        raise ValueError("cpu_threads_bind = 'spread' needs at least one usable core")
    return str(sorted(cores)[replica_index % len(cores)])
