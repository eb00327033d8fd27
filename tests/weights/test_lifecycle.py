"""Pieces of the weight path that need no engine: the communicator's lifecycle on real gloo
groups (two ranks in two threads of this process), dtypes resolved and checked, snapshots
written shard by shard, and the engine config's staging rules."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from weights.formats.snapshot import SnapshotWriter, safetensors_weights
from weights.shared.communicator import TransferTimeout, WeightGroup
from weights.shared.dtypes import dtype_mismatch, lora_dtype_problem, resolve_dtype
from weights.shared.rendezvous import connect_store


@pytest.fixture
def store():
    return connect_store("127.0.0.1", 0, is_master=True, timeout_s=10)


def _pair(store, group_id: int, timeout_s: float = 2.0) -> list[WeightGroup]:
    groups: list = [None, None]

    def form(rank: int) -> None:
        # Each rank its own store client: one client serves one blocking request at a time.
        client = (
            store
            if rank == 0
            else connect_store("127.0.0.1", store.port, is_master=False, timeout_s=10)
        )
        groups[rank] = WeightGroup(client, "127.0.0.1", group_id, rank, 2, "gloo", timeout_s)

    threads = [threading.Thread(target=form, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return groups


def test_a_group_serves_many_broadcasts_and_closes_after_them(store):
    sender, receiver = _pair(store, group_id=0)
    for value in (1.0, 2.0, 3.0):  # one communicator, three rounds
        got = torch.zeros(4)
        send_work = sender.broadcast(torch.full((4,), value))
        receiver.wait(receiver.broadcast(got), "a test tensor")
        sender.wait(send_work, "a test tensor")
        assert torch.equal(got, torch.full((4,), value))
    pending = sender.broadcast(torch.ones(4))  # still in flight when close() is called
    got = torch.zeros(4)
    receiving = threading.Thread(target=lambda: receiver.wait(receiver.broadcast(got), "x"))
    receiving.start()
    sender.close()  # synchronises (the pending broadcast completes), then aborts
    receiving.join(timeout=5)
    assert pending.is_completed() and torch.equal(got, torch.ones(4))
    assert sender.closed
    sender.close()  # idempotent
    receiver.close()


def test_a_peer_that_never_joins_the_collective_aborts_the_group_in_time(store):
    sender, receiver = _pair(store, group_id=1, timeout_s=5.0)
    work = sender.broadcast(torch.ones(1024))  # the receiver never posts its side
    started = time.monotonic()
    with pytest.raises(TransferTimeout, match="no progress in 1s"):
        sender.wait(work, "a bucket", timeout_s=1.0)
    assert 1.0 <= time.monotonic() - started < 3.0 and sender.closed
    receiver.abort()


def test_dtypes_resolve_per_device_and_a_mismatch_says_what_to_set():
    assert resolve_dtype("auto", on_gpu=True) == "bfloat16"
    assert resolve_dtype("auto", on_gpu=False) == "float32"
    assert resolve_dtype("bf16", on_gpu=False) == "bfloat16"  # the short names still work
    assert resolve_dtype("float16", on_gpu=True) == "float16"
    with pytest.raises(ValueError):
        resolve_dtype("fp8", on_gpu=True)
    assert dtype_mismatch("bfloat16", "bfloat16") is None
    message = dtype_mismatch("float32", "bfloat16")
    assert 'actor.engine.dtype = "float32"' in message and 'learner.dtype = "bfloat16"' in message
    assert "float32 or bfloat16 only" in dtype_mismatch("bfloat16", "float16")


def test_a_float32_lora_engine_on_a_gpu_is_refused_with_what_to_set():
    # vLLM's LoRA kernels on CUDA take no float32 (an AssertionError in the engine on an H100).
    message = lora_dtype_problem("float32", enable_lora=True, on_gpu=True)
    assert 'actor.engine.dtype = "bfloat16"' in message and "enable_lora" in message
    assert lora_dtype_problem("bfloat16", enable_lora=True, on_gpu=True) is None
    assert lora_dtype_problem("float32", enable_lora=True, on_gpu=False) is None  # CPU tests
    assert lora_dtype_problem("float32", enable_lora=False, on_gpu=True) is None  # merged


def test_snapshot_is_written_shard_by_shard_and_reads_back(tmp_path):
    tensors = [(f"w{i}", torch.full((256,), float(i))) for i in range(5)]  # 1 KiB each
    writer = SnapshotWriter(tmp_path, 7, shard_bytes=2048)
    passed = list(writer.tee(iter(tensors)))
    assert writer.num_files == 2  # two full shards of 2 KiB written while streaming
    final = writer.finish()
    assert final == tmp_path.resolve() / "v000007" and writer.num_files == 3
    assert [p.name for p in sorted(final.iterdir())] == [
        "model-00001.safetensors",
        "model-00002.safetensors",
        "model-00003.safetensors",
    ]
    assert [n for n, _ in passed] == [n for n, _ in tensors]
    back = dict(safetensors_weights(final))
    assert all(torch.equal(back[name], tensor) for name, tensor in tensors)


def test_engine_staging_rules():
    from actors.config import VllmEngineConfig

    assert not VllmEngineConfig(model="m").stages_weights  # streamed, whatever the GPUs
    assert not VllmEngineConfig(model="m", tensor_parallel_size=2).stages_weights
    assert not VllmEngineConfig(model="m", staged_weight_load=False).stages_weights
    assert VllmEngineConfig(model="m", staged_weight_load=True).stages_weights  # opt-in
    with pytest.raises(ValueError, match="every worker would stage the whole model"):
        VllmEngineConfig(model="m", pipeline_parallel_size=2, staged_weight_load=True)
    with pytest.raises(ValueError, match="weight_swap needs staged_weight_load"):
        VllmEngineConfig(model="m", weight_swap=True)
    assert VllmEngineConfig(model="m", staged_weight_load=True, weight_swap=True).weight_swap


def test_the_shadow_model_serves_cpu_engines_in_eager_mode_without_vllm_lora():
    from types import SimpleNamespace as Config

    from weights.engine_side.shadow import supported

    def config(device: str, *, eager: bool = True, lora=None):
        return Config(
            device_config=Config(device=torch.device(device)),
            model_config=Config(enforce_eager=eager),
            lora_config=lora,
        )

    assert supported(config("cpu"))
    assert not supported(config("cuda"))  # a CUDA graph keeps the old tensors' addresses
    assert not supported(config("cpu", eager=False))
    assert not supported(config("cpu", lora=object()))  # vLLM's LoRA layers wrap the base
