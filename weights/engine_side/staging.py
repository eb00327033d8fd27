"""Staged rounds received while the engine generates, to shorten an update's stall: with
`staged_weight_load`, a worker receives the next version into host memory in a thread of
its own, beside the live weights, and generation is paused only for the load.

    actor (actors/vllm_engine.py)              engine worker (this mixin, in vLLM's worker)
    collective_rpc("stage_weights", ticket) ─► a thread joins the round, receives (and
                                                 decodes deltas) into host copies
    generation goes on; every few ms:
    collective_rpc("staged_weights_state") ──► {"done", "error"}: a round that failed while
                                                 staging never touched the weights
    pause ─► collective_rpc("load_staged_weights") ─► vLLM's reload of the staged tensors
          ─► relabel ─► resume

Memory: the staged version is a host copy of the model per worker, as staged loads always
held; it is dropped once loaded. The thread is the round's only user of the worker's
weight channel: the actor holds its update lock from staging to the load, and a stage
while another is still receiving is refused.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from weights.engine_side.shadow import ShadowModel, supported
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


class RoundStaging:
    """Mixed into `WeightSyncExtension` (`self` is vLLM's worker)."""

    def stage_weights(
        self, ticket: dict[str, Any], swap: bool = False, track_checksum: bool = False
    ) -> dict[str, Any]:
        """Start receiving round `ticket` in a thread; returns at once. `swap`: load it into
        the shadow model too (weights/engine_side/shadow.py), where supported."""
        previous = getattr(self, "_tether_staged", None)
        if previous is not None and not previous.done.is_set():
            return {"done": True, "error": f"round {previous.ticket.version} is still staging"}
        job = StagedRound(RoundTicket(**ticket))
        self._tether_staged = job
        spare = self._tether_shadow() if swap and job.ticket.payload != "lora" else None
        shadow = (spare, self.model_runner.get_model()) if spare is not None else None
        threading.Thread(
            target=job.receive,
            args=(self._tether_channel(), getattr(self, "device", None), shadow, track_checksum),
            name="tether-staging",
            daemon=True,
        ).start()
        return {"done": False, "error": ""}

    def staged_weights_state(self) -> dict[str, Any]:
        job = getattr(self, "_tether_staged", None)
        if job is None:
            return {"done": True, "error": "no round is staged"}
        return {"done": job.done.is_set(), "error": job.error}

    def load_staged_weights(self, ticket: dict[str, Any], track_checksum: bool = False):
        """Load the staged round (generation is paused now). Reports like
        `receive_weights`; never raises for a round the model refuses."""
        job, self._tether_staged = getattr(self, "_tether_staged", None), None
        version = RoundTicket(**ticket).version
        if job is None or job.ticket.version != version or job.error:
            error = job.error if job is not None and job.error else f"round {version} not staged"
            return {"version": version, "ok": False, "error": error, "weights_mixed": False}
        started = time.monotonic()
        result = {"version": version, "ok": True, "error": "", "receive_s": job.receive_s,
                  "wire_s": job.wire_s}  # fmt: skip
        if job.shadowed is not None:  # already loaded, off the pause: trade places
            self._tether_shadow().swap_into(self.model_runner.get_model())
            self._tether_checksum = job.shadowed["checksum"]
            load_s = time.monotonic() - started
            return {**result, "num_bytes": job.shadowed["num_bytes"], "load_s": load_s,
                    "shadow_s": job.shadow_s, "weights_mixed": False}  # fmt: skip
        self._tether_load_started = False
        try:
            result.update(self._tether_load_round(job.ticket, job.weights, track_checksum))
        except (RuntimeError, ValueError) as e:  # the model refused a tensor
            error = f"{type(e).__name__}: {e}"
            result.update(ok=False, error=error, weights_mixed=self._tether_load_started)
            return result
        result.update(load_s=time.monotonic() - started, weights_mixed=False)
        return result

    def _tether_shadow(self) -> ShadowModel | None:
        """This worker's shadow model (None where unsupported: GPU, graphs, vLLM's LoRA)."""
        if not hasattr(self, "_tether_shadow_model"):
            config = self.vllm_config
            self._tether_shadow_model = ShadowModel(config) if supported(config) else None
        return self._tether_shadow_model

    def drop_staged_weights(self) -> None:
        """Forget a staged round that will not be loaded (its receive failed elsewhere)."""
        self._tether_staged = None
