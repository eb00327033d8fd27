"""The weights log (docs/weights.md): every policy version between two snapshots written as its
change from the version before, so an actor outside the learner's network follows every
version from the object store (local disk or S3) without joining the broadcast.

    learner (rank 0)                                     actor (actors/weight_log.py)
    snapshot v10 (full, formats/snapshot.py) ◄── keyframe ──► loads it, or its own copy of v10
    deltas/v000011.delta  (XOR vs v10, zstd)  ──────────┐
    deltas/v000012.delta  (XOR vs v11, zstd)  ──────────┴──► replay: v10 + 11 + 12 = v12,
    snapshot v20 ... (older deltas are deleted)                bit for bit, checked by CRC

A delta file is one object, written as the tensors stream past and renamed into place:

    b"TDLT" | payloads | header (JSON) | header length (uint64, little-endian)

The header names the version, its base (the version before) and, for every tensor, where
its payload lies with the encoding and the CRC-32 of the tensor it must give
(weights/shared/delta.py). `crc` and `base_crc` fingerprint the whole version and its base (the
CRC-32 of every tensor's CRC, in name order), so a reader whose copy is not the base (it
missed a delta, or holds a rolled-back history) finds out before it decodes anything.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from weights.shared.buckets import dtype_name
from weights.shared.delta import DeltaMismatch, Payload, crc_of, decode, encode

MAGIC = b"TDLT"
_LENGTH = struct.Struct("<Q")


def delta_name(version: int) -> str:
    return f"v{version:06d}.delta"


def delta_version(name: str) -> int | None:
    """The version a delta file's name holds; None for any other name."""
    stem = name.removesuffix(".delta")
    if stem == name or not stem.startswith("v") or not stem[1:].isdigit():
        return None
    return int(stem[1:])


def version_crc(crcs: Mapping[str, int]) -> int:
    """One fingerprint of a whole version from its tensors' CRCs (name order)."""
    return zlib.crc32(json.dumps(sorted(crcs.items())).encode())


@dataclass(frozen=True)
class DeltaHeader:
    version: int
    base: int
    crc: int
    """`version_crc` of the version this delta gives."""
    base_crc: int
    """`version_crc` of the version it must be applied to."""
    tensors: dict[str, dict]
    """name -> {dtype, shape, encoding, crc, numel, offset, nbytes} (offset from the first
    payload byte)."""

    @property
    def num_bytes(self) -> int:
        return sum(t["nbytes"] for t in self.tensors.values())


class DeltaFile:
    """A delta file opened for reading: its header, and each tensor's payload on demand."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb")
        try:
            self.header = self._read_header()
        except (ValueError, TypeError, OSError) as e:
            self.close()
            raise DeltaMismatch(f"{self.path} is not a readable weights delta ({e})") from e

    def _read_header(self) -> DeltaHeader:
        size = self._file.seek(0, os.SEEK_END)
        if size < len(MAGIC) + _LENGTH.size:
            raise ValueError("too short")
        self._file.seek(0)
        if self._file.read(len(MAGIC)) != MAGIC:
            raise ValueError("no TDLT magic")
        self._file.seek(size - _LENGTH.size)
        (length,) = _LENGTH.unpack(self._file.read(_LENGTH.size))
        self._file.seek(size - _LENGTH.size - length)
        return DeltaHeader(**json.loads(self._file.read(length)))

    def payload(self, name: str) -> Payload:
        entry = self.header.tensors.get(name)
        if entry is None:
            raise DeltaMismatch(f"{self.path.name} has no tensor {name!r}")
        self._file.seek(len(MAGIC) + entry["offset"])
        data = self._file.read(entry["nbytes"])
        if len(data) != entry["nbytes"]:
            raise DeltaMismatch(f"{self.path.name}: {name} is cut short")
        return Payload(entry["encoding"], data, entry["crc"], entry["numel"])

    def close(self) -> None:
        self._file.close()


class _PendingDelta:
    """A delta file being written, payload by payload, into a temporary file; the header
    goes last (its offsets are known only then) and the file is renamed into place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")
        self._file = open(self.tmp, "wb")
        self._file.write(MAGIC)
        self.tensors: dict[str, dict] = {}
        self.offset = 0

    def add(self, name: str, tensor: torch.Tensor, payload: Payload) -> None:
        self._file.write(payload.data)
        self.tensors[name] = {
            "dtype": dtype_name(tensor),
            "shape": list(tensor.shape),
            "encoding": payload.encoding,
            "crc": payload.crc,
            "numel": payload.numel,
            "offset": self.offset,
            "nbytes": payload.num_bytes,
        }
        self.offset += payload.num_bytes

    def finish(self, **fields) -> Path:
        header = json.dumps({**fields, "tensors": self.tensors}).encode()
        self._file.write(header + _LENGTH.pack(len(header)))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)


class DeltaLogWriter:
    """Rank 0's side: keeps the last version written (one host copy of the model, in the
    wire dtype) and writes each next one as a delta file against it into `directory`,
    tensor by tensor as they stream past (`tee`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.version: int | None = None
        """The version held (None: none yet; the next version is only remembered)."""
        self._tensors: dict[str, torch.Tensor] = {}
        self._crcs: dict[str, int] = {}
        self.num_bytes = 0
        """Size of the last delta written (0: none)."""
        self.last_path: Path | None = None
        """The last delta file written (None: none)."""

    def tee(
        self, version: int, named: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass `named` (version `version`, whole) through; once exhausted, its delta from
        the version held is in place (none when nothing is held, or the names or shapes
        changed: the next snapshot is the keyframe), and `version` is held."""
        pending = None
        if self.version is not None:
            pending = _PendingDelta(self.directory / delta_name(version))
        before, self._tensors, crcs = self._tensors, {}, {}
        try:
            for name, tensor in named:
                host = tensor.detach().to("cpu").contiguous()
                host = host.clone() if host.data_ptr() == tensor.data_ptr() else host
                previous = before.pop(name, None)
                if pending is not None and _same(previous, host):
                    payload = encode(host, previous, "xor")
                    pending.add(name, host, payload)
                    crcs[name] = payload.crc
                else:
                    crcs[name] = crc_of(host)
                self._tensors[name] = host
                yield name, tensor
        except BaseException:
            if pending is not None:
                pending.discard()
            self.forget()
            raise
        self.num_bytes, self.last_path = 0, None
        if pending is not None and not before and pending.tensors.keys() == crcs.keys():
            fields = dict(version=version, base=self.version, crc=version_crc(crcs))
            self.last_path = pending.finish(**fields, base_crc=version_crc(self._crcs))
            self.num_bytes = pending.offset
        elif pending is not None:
            pending.discard()
        self.version, self._crcs = version, crcs

    def forget(self) -> None:
        """Hold nothing (a resumed learner's weights are not the ones held)."""
        self.version, self._tensors, self._crcs = None, {}, {}

    def prune(self, *, through: int | None = None, above: int | None = None) -> None:
        """Delete the delta files of versions <= `through` (a newer snapshot replaces them)
        and > `above` (a history a resumed learner rolled back)."""
        for path in self.directory.glob("v*.delta"):
            version = delta_version(path.name)
            if version is None:
                continue
            if (through is not None and version <= through) or (
                above is not None and version > above
            ):
                path.unlink(missing_ok=True)


def _same(previous: torch.Tensor | None, current: torch.Tensor) -> bool:
    return (
        previous is not None and previous.shape == current.shape and previous.dtype == current.dtype
    )


def replay(
    base: Iterable[tuple[str, torch.Tensor]],
    base_crcs: Mapping[str, int] | None,
    deltas: list[DeltaFile],
) -> Iterator[tuple[str, torch.Tensor, int]]:
    """Each tensor of `base` with `deltas` applied in order, and its CRC: (name, tensor,
    crc). The chain is checked first (each delta's base is the version before it, and the
    first one's base fingerprint is `base_crcs`'s when given); every decode checks its
    CRC. DeltaMismatch on any break: the reader loads a snapshot instead."""
    for before, after in zip(deltas, deltas[1:], strict=False):
        if after.header.base != before.header.version or after.header.base_crc != before.header.crc:
            raise DeltaMismatch(
                f"{after.path.name} follows v{after.header.base}, not v{before.header.version}"
            )
    if deltas and base_crcs is not None and version_crc(base_crcs) != deltas[0].header.base_crc:
        raise DeltaMismatch(
            f"{deltas[0].path.name} is not a delta against the weights held "
            f"(v{deltas[0].header.base} of another history)"
        )
    seen = 0
    for name, tensor in base:
        crc = None
        for delta in deltas:
            payload = delta.payload(name)
            tensor = decode(payload, tensor, tensor)
            crc = payload.crc
        seen += 1
        yield name, tensor, crc if crc is not None else crc_of(tensor)
    for delta in deltas:
        if len(delta.header.tensors) != seen:
            raise DeltaMismatch(
                f"{delta.path.name} has {len(delta.header.tensors)} tensors, the base {seen}"
            )
