"""The settings NCCL reads while a weight group is built and while a role starts
(weights/shared/nccl_env.py): no watchdog on a weight group, so a round we gave up never reaches
NCCL's process monitor; and the non-blocking init's bound set before any collective.

A CPU build of torch has no ProcessGroupNCCL: the weight group's constructor is replaced by
one that records what NCCL would read (the environment, the options) at that moment. What
NCCL then does with them needs a GPU (docs/gpu.md, "First contact")."""

from __future__ import annotations

import os
from datetime import timedelta
from types import SimpleNamespace

import torch.distributed as dist

from learner.config import LearnerConfig
from learner.main import _init_distributed
from weights.shared import communicator
from weights.shared.nccl_env import prepare_role, role_environ, unsafe_settings

KEYS = ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_NONBLOCKING_TIMEOUT")  # fmt: skip


class RecordingNCCL:
    """Stands in for ProcessGroupNCCL's constructor: records what it would read."""

    built: list[dict] = []

    class Options:
        def __init__(self):
            self.config = SimpleNamespace(blocking=1)
            self._timeout = None
            self.group_name = ""

    def __init__(self, store, rank, world_size, options):
        environ = {key: os.environ.get(key) for key in KEYS}
        RecordingNCCL.built.append({"environ": environ, "options": options, "rank": rank})


def _clear(monkeypatch):
    for key in KEYS:  # set, then deleted: restored to absent after the test
        monkeypatch.setenv(key, "x")
        monkeypatch.delenv(key)


def test_a_weight_group_is_built_without_a_watchdog_and_non_blocking(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setattr(dist, "ProcessGroupNCCL", RecordingNCCL, raising=False)
    RecordingNCCL.built.clear()
    communicator._new_backend(dist.HashStore(), "127.0.0.1", 3, 1, 2, "nccl", 30.0)
    [built] = RecordingNCCL.built
    assert built["environ"]["TORCH_NCCL_BLOCKING_WAIT"] == "1"  # no watchdog thread
    assert built["environ"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert built["options"].config.blocking == 0
    assert built["options"]._timeout == timedelta(seconds=30 + communicator.WATCHDOG_GRACE_S)
    assert built["options"].group_name == "tether-weights-3"
    # Only for this group: the process's other groups (FSDP's) keep torch's defaults.
    assert all(os.environ.get(key) is None for key in KEYS)


def test_a_learner_rank_bounds_nccl_init_before_any_collective(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    config = LearnerConfig(model_path="m", weight_sync={"transfer_timeout_s": 45})
    _init_distributed(config)
    assert os.environ["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "45"
    monkeypatch.setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", "300")  # the user's wins
    _init_distributed(config)
    assert os.environ["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "300"


def test_settings_that_would_undo_it_are_named(monkeypatch, caplog):
    assert role_environ(0.4) == {"TORCH_NCCL_NONBLOCKING_TIMEOUT": "1"}
    assert unsafe_settings({"TORCH_NCCL_EXTRA_DUMP_ON_EXEC": "0"}) == []
    [line] = unsafe_settings({"TORCH_NCCL_EXTRA_DUMP_ON_EXEC": "1", "NCCL_DEBUG": "INFO"})
    assert line.startswith("TORCH_NCCL_EXTRA_DUMP_ON_EXEC=1: ")
    _clear(monkeypatch)
    monkeypatch.setenv("TORCH_NCCL_ENABLE_MONITORING", "0")
    prepare_role(60)
    assert "TORCH_NCCL_ENABLE_MONITORING=0" in caplog.text
