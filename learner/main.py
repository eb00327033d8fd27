"""The learner process (one per rank): build the trainer, then rank 0 runs the loop and
the others follow it. Entered from `learner/cli.py` once the config is known to be valid."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from broker.config import BrokerConfig
from common.config import load_section
from common.cuda_driver import CudaUnavailable, require_cuda
from common.metrics import serve_health, serve_metrics
from common.storage_config import StorageConfig
from learner.config import LearnerConfig
from learner.loop import Learner
from learner.reporting import Reporter
from learner.trainer.checkpoint import latest_checkpoint, read_training_state
from learner.trainer.model_init import compute_dtype, default_device, load_model
from learner.trainer.ranks import RankCommands, command_group, follow
from learner.trainer.trainer import Trainer
from weights.shared.nccl_env import prepare_role

log = logging.getLogger("learner")


def _init_distributed(config: LearnerConfig) -> torch.device:
    """This rank's device (set before anything touches CUDA: a context created earlier
    would sit on GPU 0 for every rank) and, under torchrun, the default group bound to it.
    A GPU config on a machine that gives torch none stops here (`CudaUnavailable`)."""
    if config.device == "cuda":
        require_cuda("learner.device")
    prepare_role(config.weight_sync.transfer_timeout_s)  # before the first NCCL collective
    device = default_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            device_id=device if device.type == "cuda" else None,
            timeout=timedelta(seconds=config.collective_timeout_s),
        )
    return device


def _build_trainer(config: LearnerConfig, device: torch.device) -> Trainer:
    """The policy and (with a KL term) the reference model, each loaded sharded."""
    dtype = compute_dtype(config.dtype, device)
    bf16 = dtype == torch.bfloat16
    model = load_model(config.model_path, device=device, bf16=bf16, finetune=config.finetune)
    ref_model = None
    if config.algorithm.kl_coef > 0:
        ref_path = config.ref_model_path or config.model_path
        ref_model = load_model(ref_path, device=device, bf16=bf16)
    return Trainer(model, config, ref_model=ref_model, device=device, dtype=dtype)


def _open_artifacts(storage: StorageConfig, config: LearnerConfig, *, run_name: str):
    """The bucket's uploader (learner/artifacts.py), None without a bucket."""
    if not storage.enabled:
        return None
    from learner.artifacts import open_artifacts

    return open_artifacts(
        storage,
        run_name=run_name,
        checkpoint_root=Path(config.checkpoint.dir),
        keep_local=config.checkpoint.keep,
        resume=config.checkpoint.resume,
    )


def _resume_point(config: LearnerConfig, *, namespace: str) -> tuple[Path | None, dict | None]:
    """The checkpoint to resume (None: none, or resume off) and its dataset cursor. Said in
    one loud line: a learner started again in the same directory continues the old run."""
    resume_from = latest_checkpoint(config.checkpoint.dir) if config.checkpoint.resume else None
    if resume_from is None:
        return None, None
    state = read_training_state(resume_from)
    run_id = state.dataset_cursor.get("run_id", namespace)  # none before run ids
    log.warning("resuming run %s from checkpoint %s at version %d (`learner --fresh` starts "
                "anew)", run_id, resume_from, state.version)  # fmt: skip
    return resume_from, state.dataset_cursor


def run(config_path: str, overrides: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_section(LearnerConfig, config_path, "learner", overrides)
    broker = load_section(BrokerConfig, config_path, "broker", overrides)
    storage = load_section(StorageConfig, config_path, "storage", overrides)
    try:
        device = _init_distributed(config)
    except CudaUnavailable as e:
        print(f"learner: {e}", file=sys.stderr)
        return 1
    commands_group = command_group(config.command_timeout_s)
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.seed)
    trainer = _build_trainer(config, device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank != 0:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            # This node's probes (rank 0 reports the metrics): alive, and ready now that
            # its trainer is built.
            serve_health(config.metrics_port, config.metrics_host, setting="learner.metrics_port")
        follow(trainer, checkpoint_dir=config.checkpoint.dir, group=commands_group)
        dist.destroy_process_group()
        return 0

    from weights.learner_side.sender import WeightSender

    run_dir = Path(config.run_dir)
    # Before looking for a checkpoint: a newer one may be in the bucket.
    artifacts = _open_artifacts(storage, config, run_name=broker.namespace)
    # The history files are cut back to what the checkpoint covers before anything is written.
    resume_from, position = _resume_point(config, namespace=broker.namespace)
    reporter = Reporter(
        config,
        run_dir,
        position=position,
        on_eval_written=artifacts.evals_written if artifacts else None,
    )
    learner: Learner | None = None

    def ready() -> bool:
        """/readyz: the trainer is built and the loop is connected to the bus."""
        nc = getattr(learner, "nc", None)  # set once Learner.run has connected
        return nc is not None and nc.is_connected

    port = serve_metrics(
        config.metrics_port, config.metrics_host, ready=ready, setting="learner.metrics_port"
    )
    log.info("metrics, /healthz, /readyz on http://%s:%d", config.metrics_host, port)
    sender = None
    if config.broadcast_weights:  # with LoRA, rounds carry the adapter (weights/formats/adapter.py)
        sender = WeightSender(  # engines must compute in the trainer's dtype
            config.weight_sync, dtype=trainer.dtype_name, adapter_config=trainer.adapter_config
        )
    commands = RankCommands(
        trainer,
        checkpoint_dir=config.checkpoint.dir,
        keep=config.checkpoint.keep,
        snapshot_dir=run_dir / "weights",
        snapshot_interval=config.snapshot_interval,
        snapshot_deltas=config.snapshot_deltas,
        sender=sender,
        group=commands_group,
        artifacts=artifacts,
    )
    learner = Learner(
        config, broker, commands, reporter, resume_from=resume_from, artifacts=artifacts
    )

    try:
        return _run_loop(learner)
    finally:
        commands.stop()
        if artifacts is not None:
            artifacts.close()  # the last checkpoint goes up before the process ends
        reporter.close()
        if sender is not None:
            sender.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_loop(learner: Learner) -> int:
    """Rank 0's loop until done (0) or stopped by SIGINT/SIGTERM (130)."""

    async def main() -> dict:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        return await learner.run()

    try:
        summary = asyncio.run(main())
        log.info("done: %s", summary)
        return 0
    except asyncio.CancelledError:
        log.warning("stopped by a signal at version %d", learner.commands.version)
        return 130
