"""One round received in the background into host memory (staged loads), and with a shadow
model loaded into it, off the engine's pause (weights/engine_side/staging.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from weights.shared.protocol import RoundTicket


@dataclass
class StagedRound:
    """One round being received into host memory (and with a shadow model, loaded into
    it), and what came of it."""

    ticket: RoundTicket
    weights: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    error: str = ""
    receive_s: float = 0.0
    wire_s: float = 0.0
    """Of `receive_s`, the messages' time on the wire (`WeightChannel.wire_s`)."""
    shadow_s: float = 0.0
    """Loading the shadow model (0: none)."""
    shadowed: dict[str, Any] | None = None
    """With a shadow: the version's bytes and checksum; the weights are in the shadow."""
    done: threading.Event = field(default_factory=threading.Event)

    def receive(self, channel, device: Any, shadow: tuple | None, track: bool) -> None:
        """Receive the round; `shadow`: (ShadowModel, the live model) to load it into."""
        started = time.monotonic()
        try:
            if isinstance(device, torch.device) and device.type == "cuda":
                torch.cuda.set_device(device)  # the worker's GPU, not this thread's default
            self.weights = [(name, tensor.cpu()) for name, tensor in channel.receive(self.ticket)]
            self.receive_s, self.wire_s = time.monotonic() - started, channel.wire_s
            if shadow is not None:
                self._into(shadow, track)
        # The round failed (a peer died, the learner went away, we were not seated, a delta
        # we cannot apply; the shadow refused a tensor): nothing reached the live model.
        except (RuntimeError, TimeoutError, ValueError) as e:
            self.weights, self.error = [], f"{type(e).__name__}: {e}"
        finally:
            self.receive_s = self.receive_s or time.monotonic() - started
            self.done.set()

    def _into(self, shadow: tuple, track: bool) -> None:
        from weights.shared.tensors import checksum

        started = time.monotonic()
        num_bytes = sum(t.numel() * t.element_size() for _, t in self.weights)
        fingerprint = checksum(self.weights) if track else None
        spare, live = shadow
        spare.load(self.weights, live)
        self.weights = []  # in the shadow now: the host copy goes
        self.shadowed = {"num_bytes": num_bytes, "checksum": fingerprint}
        self.shadow_s = time.monotonic() - started
