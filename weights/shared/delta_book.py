"""Delta rounds (docs/weights.md, "Delta rounds"): each side of the broadcast keeps the
version the engines hold, so a round sends only what changed (weights/shared/delta.py's codec) and
a receiver rebuilds the new version bit for bit.

    sender (learner rank 0)                           receiver (each engine worker)
    SenderBook: the last version sent, host memory    ReceiverBook: the last version received
      base_for(v, same group): a delta against v-1      decode: a delta whose base is not the
        only when the same members took v-1 whole         version held raises DeltaMismatch
        and the keyframe is fewer than K rounds old       (a missed delta): that round fails,
      encode: each tensor as Encoded (a delta, or       the sender's next is a keyframe
        its raw bytes in a keyframe), kept as sent
      commit(v) once every member confirmed;
      forget() when the round failed: next, a keyframe

A keyframe is the tensor's own bytes (no compression: it travels at the wire's speed); a
delta is the XOR of the bit patterns, zstd-compressed, with a CRC-32 of the tensor it must
give. Only rounds of one group can be chained: a new member, one that left or failed, a
restarted learner, each forms a new group, and a new group starts with a keyframe. The cost
is one host copy of the model (in the wire dtype) on the learner's rank 0 and in every
engine worker; `weight_sync.delta` is therefore opt-in (docs/weights.md, "Delta rounds").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from weights.shared.buckets import Encoded, dtype_name
from weights.shared.delta import DeltaMismatch, Payload, decode, encode

KEYFRAME = -1
"""`meta["base"]` of a tensor sent whole."""


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor of its own (the source may be a view of a buffer reused later)."""
    host = tensor.detach().to("cpu").contiguous()
    return host.clone() if host.data_ptr() == tensor.data_ptr() else host


class SenderBook:
    """The version the engines hold, as the sender last sent it."""

    def __init__(self, keyframe_interval: int) -> None:
        self.keyframe_interval = keyframe_interval
        self.tensors: dict[str, torch.Tensor] = {}
        self.version: int | None = None
        """The version every member of the current group holds; None: none known."""
        self.keyframe_version: int | None = None
        self.raw_bytes = 0
        """Bytes of the last round's tensors in the wire dtype (what a keyframe sends)."""

    def base_for(self, version: int, *, same_group: bool) -> int | None:
        """The version round `version` is a delta against, or None for a keyframe."""
        if not same_group or self.version is None or self.keyframe_version is None:
            return None
        if version - self.keyframe_version >= self.keyframe_interval:
            return None
        return self.version

    def encode(
        self, named: Iterable[tuple[str, torch.Tensor]], version: int, base: int | None
    ) -> Iterator[tuple[str, Encoded]]:
        """Each tensor as it goes on the wire (a delta against `base`, or whole), kept as
        the version being sent."""
        self.raw_bytes = 0
        for name, tensor in named:
            host = _host_copy(tensor)
            previous = self.tensors.get(name) if base is not None else None
            meta: dict = {"v": version, "base": KEYFRAME}
            if previous is None or previous.shape != host.shape or previous.dtype != host.dtype:
                # Whole: the bytes from where the tensor is (on NCCL its GPU), not the copy.
                data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            else:
                payload = encode(host, previous, "xor")
                data = torch.frombuffer(bytearray(payload.data), dtype=torch.uint8)
                meta.update(base=base, enc=payload.encoding, crc=payload.crc, numel=payload.numel)
            meta["nbytes"] = data.numel()
            self.tensors[name] = host
            self.raw_bytes += host.numel() * host.element_size()
            yield name, Encoded(data, dtype_name(host), list(host.shape), meta)

    def commit(self, version: int, base: int | None) -> None:
        """Every member confirmed round `version`: it is what they hold now."""
        self.version = version
        if base is None:
            self.keyframe_version = version

    def forget(self) -> None:
        """A round failed (members may hold part of it): the next round is a keyframe."""
        self.tensors.clear()
        self.version = self.keyframe_version = None


class ReceiverBook:
    """The version this worker holds, as the sender sent it (host memory)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.version: int | None = None

    def decode(
        self, stream: Iterable[tuple[str, torch.Tensor | Encoded]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The round's tensors rebuilt; plain tensors (a sender without deltas) pass
        through. DeltaMismatch when a delta's base is not the version held, or its result
        not the sender's: the book is forgotten then (the next round is a keyframe)."""
        received: int | None = None
        for name, item in stream:
            if not isinstance(item, Encoded):
                yield name, item
                continue
            received = item.meta["v"]
            tensor = self._rebuild(name, item)
            # A keyframe's tensor is a view of the bucket's buffer (on the group's device):
            # keep a copy. A decoded one is a host tensor of its own already.
            whole = item.meta["base"] == KEYFRAME
            self.tensors[name] = _host_copy(tensor) if whole else tensor
            yield name, tensor
        if received is not None:
            self.version = received

    def _rebuild(self, name: str, item: Encoded) -> torch.Tensor:
        meta, dtype = item.meta, getattr(torch, item.dtype)
        if meta["base"] == KEYFRAME:
            return item.data.view(dtype).reshape(item.shape)
        if meta["base"] != self.version:
            held = self.version
            self.forget()
            raise DeltaMismatch(
                f"{name}: a delta against version {meta['base']}, but this worker holds "
                f"{held}: it missed a round; the next round is a keyframe"
            )
        data = item.data.cpu().numpy().tobytes()
        payload = Payload(meta["enc"], data, meta["crc"], meta["numel"])
        like = torch.empty(item.shape, dtype=dtype, device="meta")
        try:
            return decode(payload, self.tensors.get(name), like)
        except DeltaMismatch:
            self.forget()
            raise

    def forget(self) -> None:
        """The version held is unknown (a round failed part-way): deltas are refused until
        the next keyframe."""
        self.tensors.clear()
        self.version = None
