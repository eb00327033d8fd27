"""Weights snapshots on disk: full weights as one safetensors file in `<dir>/v<version>/`,
for actors that join late (and for recovery after a failed round). Written atomically
(a temporary directory renamed into place); read back by name, in HF checkpoint format.
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

SNAPSHOT_FILE = "model.safetensors"


def write_snapshot(
    snapshot_dir: Path, version: int, named: Iterable[tuple[str, torch.Tensor]]
) -> Path:
    """Full weights as safetensors in `<snapshot_dir>/v<version>/`, written atomically.
    Returns the directory (absolute: it is announced to actors on other machines' paths)."""
    from safetensors.torch import save_file

    snapshot_dir = Path(snapshot_dir).resolve()
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    final = snapshot_dir / f"v{version:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=".snapshot-", dir=snapshot_dir))
    save_file({name: t.detach().contiguous().cpu() for name, t in named}, tmp / SNAPSHOT_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final


def safetensors_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every *.safetensors file in a checkpoint directory, HF names."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    for file in files:
        yield from load_file(file).items()
