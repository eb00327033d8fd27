"""Loading tensors into a vLLM worker's live model, with what a load must leave behind:
the weights whole or marked mixed, the CPU engine's packed copies dropped, a checksum.

Weights are loaded with `model_runner.reload_weights(weights_iterator=...)`, which undoes
and redoes the kernel-format processing of the loaded parameters (on CPU vLLM repacks
weights after loading, and the repacked parameters have no `weight_loader`, so a plain
`model.load_weights` after start-up fails). It processes layer by layer as their tensors
arrive (vLLM's layerwise reload), so a streamed round never needs the model twice on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from safetensors import SafetensorError

from weights.engine_side.cpu_packing import (
    drop_embedding_copies,
    drop_lm_head_copies,
    dropping_embedding_copies,
)
from weights.engine_side.state import worker_state
from weights.engine_side.vocab_in_place import vocab_in_place
from weights.shared.protocol import LoadResult
from weights.shared.tensors import Checksum, tied_aliases, with_aliases


def reload(worker: Any, weights: Iterable[tuple[str, torch.Tensor]], track: bool) -> int:
    """Load (name, tensor) pairs in HF checkpoint format, and with `track` remember their
    checksum (the model's own parameters cannot be summed: on CPU the linear weights live
    repacked in oneDNN handles, the parameters left empty). Returns bytes loaded. A load
    cut short (its source failed, or the model refused a tensor) is finalised (layers not
    reached keep their old weights, no layer is left on the meta device) before the error
    goes on; the state's `load_started` then says whether any tensor reached the model."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    state = worker_state(worker)
    model = worker.model_runner.get_model()
    if state.aliases is None:  # ties are intact until the first reload
        state.aliases = tied_aliases(model)
    fingerprint = Checksum()
    num_bytes = 0

    def recorded():
        nonlocal num_bytes
        for index, (name, tensor) in enumerate(weights):
            if index == 0:  # its reload packs it again (cpu_packing)
                drop_lm_head_copies(model)
            state.load_started = True
            num_bytes += tensor.numel() * tensor.element_size()
            if track:
                fingerprint.add(tensor)
            yield name, tensor

    with set_current_vllm_config(worker.vllm_config), vocab_in_place(model) as in_place:
        state.in_place = in_place
        try:
            worker.model_runner.reload_weights(
                weights_iterator=dropping_embedding_copies(
                    model, in_place.load(with_aliases(recorded(), state.aliases))
                )
            )
            in_place.repack()
        except BaseException:  # whatever stopped it: no layer may stay on the meta device
            finalize_layerwise_reload(model, worker.vllm_config.model_config)
            raise
        finally:
            state.in_place = None
            drop_embedding_copies(model)  # one packed late (finalize) or before any round
    state.checksum = fingerprint.values if track else None
    return num_bytes


def live_destination(worker: Any) -> Callable[[str, str, list], torch.Tensor | None]:
    """Where a streamed round's lone tensor may arrive: straight into the live model's
    vocabulary layer of that name (`VocabInPlace.destination`) while a reload runs. The load
    has begun once one is handed out: a round failing mid-tensor leaves it mixed."""
    state = worker_state(worker)

    def destination(name: str, dtype: str, shape: list) -> torch.Tensor | None:
        in_place = state.in_place
        target = None if in_place is None else in_place.destination(name, dtype, shape)
        if target is not None:
            state.load_started = True
        return target

    return destination


def snapshot_load(worker: Any, load: Callable[[], None]) -> LoadResult:
    """Run a snapshot load. Never raises for a snapshot that cannot be read (it vanished or
    is cut short: the learner rotates them) or that the model refuses: `ok` False, `error`,
    and `weights_mixed` when the load had begun."""
    state = worker_state(worker)
    state.load_started = False
    try:
        load()
    except (OSError, RuntimeError, ValueError, SafetensorError) as e:
        return LoadResult().failed(f"{type(e).__name__}: {e}", mixed=state.load_started)
    return LoadResult()
