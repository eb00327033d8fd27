"""Staged rounds received while the engine generates, to shorten an update's stall: with
`staged_weight_load`, a worker receives the next version into host memory in a thread of
its own, beside the live weights, and generation is paused only for the load.

    actor (actors/vllm_engine.py)              engine worker (this mixin, in vLLM's worker)
    collective_rpc("stage_weights", ticket) ─► a thread joins the round, receives (and
                                                 decodes deltas) into host copies
    generation goes on; every few ms:
    collective_rpc("staged_weights_state") ──► StageState: a round that failed while
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
from typing import Any

from weights.engine_side.payload import load_round
from weights.engine_side.staged_round import StagedRound
from weights.engine_side.state import worker_state
from weights.shared.protocol import LoadResult, RoundTicket, StageState


class RoundStaging:
    """Mixed into `WeightSyncExtension` (`self` is vLLM's worker)."""

    def stage_weights(
        self, ticket: dict[str, Any], swap: bool = False, track_checksum: bool = False
    ) -> dict[str, Any]:
        """Start receiving round `ticket` in a thread; returns at once (a `StageState`).
        `swap`: load it into the shadow model too (weights/engine_side/shadow.py), where
        supported."""
        state = worker_state(self)
        previous = state.staged
        if previous is not None and not previous.done.is_set():
            busy = f"round {previous.ticket.version} is still staging"
            return StageState(done=True, error=busy).as_dict()
        job = StagedRound(RoundTicket.from_dict(ticket))
        state.staged = job
        spare = state.shadow(self.vllm_config) if swap and job.ticket.payload != "lora" else None
        shadow = (spare, self.model_runner.get_model()) if spare is not None else None
        threading.Thread(
            target=job.receive,
            args=(state.channel(), getattr(self, "device", None), shadow, track_checksum),
            name="tether-staging",
            daemon=True,
        ).start()
        return StageState(done=False).as_dict()

    def staged_weights_state(self) -> dict[str, Any]:
        job = worker_state(self).staged
        if job is None:
            return StageState(done=True, error="no round is staged").as_dict()
        return StageState(done=job.done.is_set(), error=job.error).as_dict()

    def load_staged_weights(
        self, ticket: dict[str, Any], track_checksum: bool = False
    ) -> dict[str, Any]:
        """Load the staged round (generation is paused now). A `LoadResult`, as
        `receive_weights`; never raises for a round the model refuses."""
        state = worker_state(self)
        job, state.staged = state.staged, None
        version = RoundTicket.from_dict(ticket).version
        if job is None or job.ticket.version != version or job.error:
            error = job.error if job is not None and job.error else f"round {version} not staged"
            return LoadResult(version=version).failed(error, mixed=False).as_dict()
        started = time.monotonic()
        if job.shadowed is not None:  # already loaded, off the pause: trade places
            state.shadow(self.vllm_config).swap_into(self.model_runner.get_model())
            state.checksum = job.shadowed["checksum"]
            result = LoadResult(version=version, num_bytes=job.shadowed["num_bytes"],
                                shadow_s=job.shadow_s)  # fmt: skip
        else:
            state.load_started = False
            try:
                result = load_round(self, job.ticket, job.weights, track_checksum)
            except (RuntimeError, ValueError) as e:  # the model refused a tensor
                error = f"{type(e).__name__}: {e}"
                failed = LoadResult(version=version, receive_s=job.receive_s, wire_s=job.wire_s)
                return failed.failed(error, mixed=state.load_started).as_dict()
        result.receive_s, result.wire_s = job.receive_s, job.wire_s
        result.load_s = time.monotonic() - started
        return result.as_dict()

    def drop_staged_weights(self) -> None:
        """Forget a staged round that will not be loaded (its receive failed elsewhere)."""
        worker_state(self).staged = None
