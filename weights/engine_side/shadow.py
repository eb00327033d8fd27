"""A second copy of a CPU engine's model, to shorten an update's stall: the next version is
loaded and processed into it while the engine generates, and swapped in by reference while
it is paused, so the pause holds no load.

    staging thread (weights/engine_side/staging.py), engine generating     paused
    received tensors ─► vLLM's reload of the SHADOW model ─►   swap(live, shadow): every
      (checkpoint format ─► kernel format: fused layers,        module's parameters and CPU
       oneDNN handles), never touching the live one             GEMM closure trade places

vLLM's CPU linear layers keep their weights packed inside a closure (`cpu_linear`) rather
than in the parameter, so a reload must rebuild them, and that is what took the pause:
about a decode step and a half on the demo. After a swap the shadow holds the version
before, in kernel form, ready to be reloaded with the next one. Built on first use from the
engine's own model directory (`load_model`, prefix `tether_shadow` so that its attention
layers register under names of their own; they never run and get no KV cache).

CPU only, eager mode only (a CUDA graph would keep reading the old tensors' addresses),
full weights only (vLLM's LoRA layers wrap the base ones): `supported` says so. Costs a
second copy of the model in host memory.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from weights.engine_side.cpu_packing import (
    drop_embedding_copies,
    drop_lm_head_copies,
    dropping_embedding_copies,
)
from weights.engine_side.vocab_in_place import vocab_in_place

PREFIX = "tether_shadow"


def supported(vllm_config) -> bool:
    """A CPU engine in eager mode without vLLM's LoRA."""
    return (
        vllm_config.device_config.device.type == "cpu"
        and vllm_config.model_config.enforce_eager
        and vllm_config.lora_config is None
    )


class ShadowModel:
    """The spare copy; `load` off the pause, `swap_into` during it."""

    def __init__(self, vllm_config) -> None:
        self.vllm_config = vllm_config
        self.model: torch.nn.Module | None = None
        self.aliases: dict[str, list[str]] = {}

    def load(self, weights: Iterable[tuple[str, torch.Tensor]], live: torch.nn.Module) -> None:
        """Reload the shadow with `weights` (every tensor of a version, checkpoint format)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        from weights.shared.tensors import tied_aliases, with_aliases

        config = self.vllm_config
        with set_current_vllm_config(config):
            if self.model is None:
                loader = get_model_loader(config.load_config)
                self.model = loader.load_model(config, config.model_config, prefix=PREFIX)
                _unshare(self.model, live)
                self.aliases = tied_aliases(self.model)  # intact until its first reload
                drop_embedding_copies(self.model)
            drop_lm_head_copies(self.model)  # not live: its head is packed again after the load
            try:
                with vocab_in_place(self.model) as in_place:
                    reload_weights(
                        config,
                        self.model,
                        weights_iterator=dropping_embedding_copies(
                            self.model, in_place.load(with_aliases(weights, self.aliases))
                        ),
                        weights_path=None,
                        is_checkpoint_format=True,
                    )
                    in_place.repack()
            except BaseException:
                # A shadow cut short holds no version: the next load starts it over.
                finalize_layerwise_reload(self.model, config.model_config)
                self.model = None
                raise

    def swap_into(self, live: torch.nn.Module) -> int:
        """Trade every module's parameters and CPU GEMM closure with `live`'s (the engine is
        paused); returns how many modules traded. The shadow then holds the version before."""
        assert self.model is not None, "load() first"
        pairs = list(zip(live.named_modules(), self.model.named_modules(), strict=True))
        for (name, _), (shadow_name, _) in pairs:
            if name != shadow_name:
                raise RuntimeError(
                    f"shadow model differs from the live one: {name} vs {shadow_name}"
                )
        traded = 0
        for (_, mine), (_, spare) in pairs:
            if mine._parameters or hasattr(mine, "cpu_linear"):
                mine._parameters, spare._parameters = spare._parameters, mine._parameters
                if hasattr(mine, "cpu_linear") or hasattr(spare, "cpu_linear"):
                    mine.cpu_linear, spare.cpu_linear = spare.cpu_linear, mine.cpu_linear
                traded += 1
        return traded


def _unshare(shadow: torch.nn.Module, live: torch.nn.Module) -> None:
    """Give the shadow its own copy of every module it shares with the live model. vLLM
    caches some modules across models (`get_rope` hands every model the same rotary
    embedding), and a reload puts each module of the model it reloads on the meta device
    for a while: reloading the shadow would take the shared rotary cache from under the
    live model's next step (seen: "Cannot copy out of meta tensor"). One copy per shared
    module, so that the shadow shares it among its own layers as the live model does."""
    import copy

    live_ids = {id(module) for module in live.modules()}
    copies: dict[int, torch.nn.Module] = {}
    for parent in list(shadow.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in live_ids:
                if id(child) not in copies:
                    copies[id(child)] = copy.deepcopy(child)
                setattr(parent, name, copies[id(child)])
