"""GPU wiring of a single-machine run: the placement plan (common/placement.py) for the
learner and the actor replicas of a validated run config, turned into what the launcher
hands its children — the learner's CUDA_VISIBLE_DEVICES (torchrun's LOCAL_RANK indexes it)
and config overrides for the actors (`actor.replica_gpus`, the engines' memory share, and
gloo for the weight broadcast when an engine shares the learner's GPU). Pure: the caller
says which GPUs the machine has (`common.placement.visible_gpus()`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from common.placement import PlacementRequest, plan_placement
from deploy.config import LocalRunConfig, RunConfig

NODE = "localhost"


@dataclass(frozen=True)
class GpuWiring:
    learner_env: dict[str, str] = field(default_factory=dict)
    """Environment of the learner process (empty without GPUs)."""
    overrides: list[str] = field(default_factory=list)
    """Config overrides for every role (the actors read theirs)."""
    summary: str = "no GPUs: learner and engines on CPU"


def gpu_wiring(run: RunConfig, local: LocalRunConfig, gpus: list[str]) -> GpuWiring:
    """The wiring of `run` on a machine with `gpus`; ValueError when they cannot hold it."""
    if not gpus or run.learner is None or run.actor is None:
        return GpuWiring()
    engine = run.actor.engine
    placement = plan_placement(
        {NODE: gpus},
        PlacementRequest(
            learner_ranks=run.learner.nproc,
            num_engines=local.actor_replicas,
            gpus_per_engine=engine.num_gpus,
            colocate=local.colocate,
            engine_memory_fraction=engine.gpu_memory_utilization,
            learner_memory_fraction=local.learner_gpu_memory_fraction,
        ),
    )
    replica_gpus = [slot.cuda_visible_devices for slot in placement.engines]
    # One gpu_memory_utilization for every replica: the smallest share any engine has.
    memory = min(slot.memory_fraction for slot in placement.engines)
    overrides = [
        f"actor.replica_gpus={json.dumps(replica_gpus)}",
        f"actor.engine.gpu_memory_utilization={memory}",
    ]
    if placement.colocated:
        # NCCL refuses two ranks of one communicator on one GPU (docs/gpu.md).
        overrides.append("learner.weight_sync.backend=gloo")
    summary = (
        f"learner on GPU(s) {placement.learner_gpus(NODE)}, engines on "
        + ", ".join(f"[{g}]" for g in replica_gpus)
        + f" at gpu_memory_utilization {memory}"
        + (" (co-located: weights over gloo)" if placement.colocated else "")
    )
    return GpuWiring(
        learner_env={
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": placement.learner_gpus(NODE),
        },
        overrides=overrides,
        summary=summary,
    )
