"""Which GPUs each learner rank and each actor engine gets: one pure function for every
launcher (`make run`, `actor --replicas N`, and `make cluster-up` on Kubernetes or Ray).

    plan_placement({"node-a": ["0", ..., "7"]}, PlacementRequest(learner_ranks=4,
                   num_engines=2, gpus_per_engine=2))
      -> learner ranks on node-a GPUs 0-3; engine 0 on 4,5; engine 1 on 6,7

Rules, in order:
- Learner ranks are packed first, node by node in the order given (FSDP's all-gathers and
  reduce-scatters stay on one node's NVLink as long as they can). Local rank r of a node
  gets that node's r-th learner GPU: torchrun's LOCAL_RANK indexes the learner's
  CUDA_VISIBLE_DEVICES.
- Each engine's GPUs (tensor x pipeline parallel) lie on one node; engines fill the nodes'
  remaining GPUs in order.
- When dedicated GPUs do not suffice, `colocate="auto"` puts the engines on GPUs the
  learner also uses (a 1-GPU machine runs the learner and every engine on GPU 0). Engines
  on a shared GPU split what the learner leaves (`learner_memory_fraction`), so vLLM's
  free-memory check at start-up passes; the weight broadcast must then go over gloo (NCCL
  refuses two ranks of one communicator on one GPU; docs/gpu.md says why gloo over host
  memory and not CUDA IPC).
- `colocate="never"` refuses instead, naming how many GPUs were needed and found.

GPU ids are strings as CUDA_VISIBLE_DEVICES names them ("3", or a UUID); a child process
sees exactly the GPUs of its slot (set CUDA_DEVICE_ORDER=PCI_BUS_ID so that indices agree
with nvidia-smi). Pure: no torch, no CUDA; `visible_gpus` is the one function that looks at
the machine (CUDA_VISIBLE_DEVICES, else `nvidia-smi`), and never initialises CUDA.

    python -m common.placement --nodes a=8,b=8 --learner-ranks 8 --engines 4 --gpus-per-engine 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal


@dataclass(frozen=True)
class PlacementRequest:
    """What is to be placed."""

    learner_ranks: int
    """Learner processes (one GPU each); 0 when the learner runs elsewhere."""
    num_engines: int
    """Actor replicas, one vLLM engine each."""
    gpus_per_engine: int = 1
    """tensor_parallel_size x pipeline_parallel_size of each engine."""
    colocate: Literal["auto", "never"] = "auto"
    """`auto`: share the learner's GPUs with engines when dedicated ones do not suffice."""
    engine_memory_fraction: float = 0.9
    """gpu_memory_utilization an engine asks for on a GPU of its own."""
    learner_memory_fraction: float = 0.4
    """On a GPU shared with engines: the share of its memory kept for the learner."""

    def __post_init__(self) -> None:
        if self.learner_ranks < 0 or self.num_engines < 0:
            raise ValueError("learner_ranks and num_engines must be >= 0")
        if self.gpus_per_engine < 1:
            raise ValueError(f"gpus_per_engine must be >= 1, got {self.gpus_per_engine}")
        if not 0 < self.engine_memory_fraction <= 1 or not 0 < self.learner_memory_fraction < 1:
            raise ValueError("memory fractions must lie in (0, 1)")


@dataclass(frozen=True)
class LearnerSlot:
    rank: int
    node: str
    local_rank: int
    gpu: str


@dataclass(frozen=True)
class EngineSlot:
    index: int
    node: str
    gpus: tuple[str, ...]
    memory_fraction: float
    """gpu_memory_utilization for this engine's vLLM."""
    shares_learner_gpu: bool = False

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)


@dataclass(frozen=True)
class Placement:
    learner: tuple[LearnerSlot, ...]
    engines: tuple[EngineSlot, ...]
    colocated: bool = False
    """Some engine shares a GPU with a learner rank (the weight broadcast must use gloo)."""
    notes: tuple[str, ...] = field(default=())

    def learner_gpus(self, node: str) -> str:
        """CUDA_VISIBLE_DEVICES of the learner's processes on `node` (local rank order)."""
        return ",".join(
            s.gpu for s in sorted(self.learner, key=lambda s: s.local_rank) if s.node == node
        )

    def as_dict(self) -> dict:
        return asdict(self)


def plan_placement(nodes: Mapping[str, Sequence[str]], request: PlacementRequest) -> Placement:
    """GPUs for every learner rank and engine over `nodes` ({node: its GPU ids}, in order).
    Raises ValueError, naming what was needed and what was found, when nothing fits."""
    free = {node: list(gpus) for node, gpus in nodes.items()}
    total = sum(len(g) for g in free.values())
    learner = _place_learner(free, request.learner_ranks, total)
    learner_gpus = {(s.node, s.gpu) for s in learner}
    engines, notes = [], []
    for index in range(request.num_engines):
        node = next((n for n, g in free.items() if len(g) >= request.gpus_per_engine), None)
        if node is None:
            break
        gpus = tuple(free[node][: request.gpus_per_engine])
        del free[node][: request.gpus_per_engine]
        engines.append(EngineSlot(index, node, gpus, request.engine_memory_fraction))
    missing = request.num_engines - len(engines)
    if missing == 0:
        return Placement(tuple(learner), tuple(engines))
    need = request.learner_ranks + request.num_engines * request.gpus_per_engine
    if request.colocate == "never" or not learner_gpus:
        raise ValueError(
            f"{request.learner_ranks} learner rank(s) and {request.num_engines} engine(s) of "
            f"{request.gpus_per_engine} GPU(s) need {need} GPUs; found {total} "
            f"({_describe(nodes)}). Use fewer replicas or a smaller tensor_parallel_size"
            + ("" if request.colocate == "never" else ", or colocate with the learner")
        )
    shared = _colocate(nodes, learner, engines, missing, request)
    notes.append(
        f"{need} GPUs needed, {total} found: {len(shared)} engine(s) share the learner's GPUs"
    )
    return Placement(tuple(learner), tuple(engines + shared), colocated=True, notes=tuple(notes))


def _place_learner(free: dict[str, list[str]], ranks: int, total: int) -> list[LearnerSlot]:
    if ranks > total:
        raise ValueError(f"{ranks} learner ranks need {ranks} GPUs; found {total}")
    slots: list[LearnerSlot] = []
    for node, gpus in free.items():
        take = min(len(gpus), ranks - len(slots))
        slots += [LearnerSlot(len(slots) + i, node, i, gpus[i]) for i in range(take)]
        del gpus[:take]
    return slots


def _colocate(
    nodes: Mapping[str, Sequence[str]],
    learner: list[LearnerSlot],
    dedicated: list[EngineSlot],
    missing: int,
    request: PlacementRequest,
) -> list[EngineSlot]:
    """The engines that did not fit, round robin over groups of the learner's GPUs (one
    node each); their memory is what the learner leaves, split between them."""
    groups: list[tuple[str, tuple[str, ...]]] = []
    for node in nodes:
        gpus = [s.gpu for s in learner if s.node == node]
        for start in range(0, len(gpus) - request.gpus_per_engine + 1, request.gpus_per_engine):
            groups.append((node, tuple(gpus[start : start + request.gpus_per_engine])))
    if not groups:
        raise ValueError(
            f"an engine of {request.gpus_per_engine} GPUs cannot share a node's learner GPUs "
            f"({len(learner)} learner GPU(s)); lower tensor_parallel_size"
        )
    per_group = [0] * len(groups)
    for i in range(missing):
        per_group[i % len(groups)] += 1
    share = 1.0 - request.learner_memory_fraction
    out = []
    for i in range(missing):
        g = i % len(groups)
        fraction = min(request.engine_memory_fraction, share / per_group[g])
        node, gpus = groups[g]
        out.append(EngineSlot(len(dedicated) + i, node, gpus, round(fraction, 4), True))
    return out


def _describe(nodes: Mapping[str, Sequence[str]]) -> str:
    return ", ".join(f"{node}: {len(gpus)}" for node, gpus in nodes.items()) or "no GPUs"


# ---- the machine: which GPUs this process may use ----------------------------------------------


def parse_visible_gpus(
    cuda_visible_devices: str | None, nvidia_smi_indices: str | None
) -> list[str]:
    """GPU ids from CUDA_VISIBLE_DEVICES when it is set (an empty value hides every GPU),
    else from `nvidia-smi --query-gpu=index --format=csv,noheader` output, else none."""
    if cuda_visible_devices is not None:
        return [g.strip() for g in cuda_visible_devices.split(",") if g.strip()]
    if nvidia_smi_indices:
        return [line.strip() for line in nvidia_smi_indices.splitlines() if line.strip()]
    return []


def visible_gpus() -> list[str]:
    """The GPUs this process may use, without touching CUDA (a launcher must not hold a CUDA
    context its children would inherit)."""
    smi = None
    if "CUDA_VISIBLE_DEVICES" not in os.environ and shutil.which("nvidia-smi"):
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        smi = result.stdout if result.returncode == 0 else None
    return parse_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), smi)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.placement", description=__doc__)
    parser.add_argument("--nodes", help="node=GPU count, comma separated (default: this machine)")
    parser.add_argument("--learner-ranks", type=int, default=1)
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--gpus-per-engine", type=int, default=1)
    parser.add_argument("--colocate", choices=("auto", "never"), default="auto")
    args = parser.parse_args(argv)
    if args.nodes:
        nodes = {
            name: [str(i) for i in range(int(count))]
            for name, _, count in (item.partition("=") for item in args.nodes.split(","))
        }
    else:
        nodes = {"localhost": visible_gpus()}
    request = PlacementRequest(
        args.learner_ranks, args.engines, args.gpus_per_engine, colocate=args.colocate
    )
    try:
        placement = plan_placement(nodes, request)
    except ValueError as e:
        print(f"placement: {e}", file=sys.stderr)
        return 2
    print(json.dumps(placement.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
