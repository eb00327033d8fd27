"""Weights snapshots on disk, for actors that join late (and for recovery after a failed
round): full weights in HF checkpoint format in `<dir>/v<version>/`, written as the tensors
arrive and read back by name.

`SnapshotWriter` takes one tensor at a time and writes a safetensors shard
(`model-00001.safetensors`, ...) whenever about `shard_bytes` have gathered, so the learner
never holds more than one shard: the same stream feeds the broadcast (`writer.tee(named)`).
The directory appears whole (a temporary directory renamed into place) on `finish()`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SHARD_BYTES = 1 << 30
"""Target size of one snapshot file (1 GiB): the most host memory a snapshot holds."""


class SnapshotWriter:
    """`<snapshot_dir>/v<version:06d>/model-NNNNN.safetensors`, one shard at a time."""

    def __init__(self, snapshot_dir: Path, version: int, shard_bytes: int = SHARD_BYTES) -> None:
        self.snapshot_dir = Path(snapshot_dir).resolve()
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        self.final = self.snapshot_dir / f"v{version:06d}"
        self.shard_bytes = shard_bytes
        self._tmp = Path(tempfile.mkdtemp(prefix=".snapshot-", dir=self.snapshot_dir))
        self._shard: dict[str, torch.Tensor] = {}
        self._shard_size = 0
        self.num_files = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Copy `tensor` to host memory; write the shard once it is full."""
        host = tensor.detach().contiguous().cpu()
        if host.data_ptr() == tensor.data_ptr():
            host = host.clone()  # the caller's tensor may be a view of a reused buffer
        self._shard[name] = host
        self._shard_size += host.numel() * host.element_size()
        if self._shard_size >= self.shard_bytes:
            self._flush()

    def tee(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass `named` through, adding every tensor to the snapshot on the way."""
        for name, tensor in named:
            self.add(name, tensor)
            yield name, tensor

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self._shard:
            return
        self.num_files += 1
        save_file(self._shard, self._tmp / f"model-{self.num_files:05d}.safetensors")
        self._shard, self._shard_size = {}, 0

    def discard(self) -> None:
        """Give up: the partial snapshot is deleted, nothing is moved into place."""
        self._shard, self._shard_size = {}, 0
        shutil.rmtree(self._tmp, ignore_errors=True)

    def finish(self) -> Path:
        """Write the last shard and move the snapshot into place; returns its directory
        (absolute: it is announced to actors that may run elsewhere)."""
        self._flush()
        if self.final.exists():
            shutil.rmtree(self.final)
        os.rename(self._tmp, self.final)
        return self.final


def write_snapshot(
    snapshot_dir: Path, version: int, named: Iterable[tuple[str, torch.Tensor]]
) -> Path:
    """Full weights of `named` as a snapshot (see `SnapshotWriter`); returns its directory."""
    writer = SnapshotWriter(snapshot_dir, version)
    for name, tensor in named:
        writer.add(name, tensor)
    return writer.finish()


def safetensors_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every *.safetensors file in a checkpoint directory, HF names, one
    file in memory at a time."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    for file in files:
        yield from load_file(file).items()
