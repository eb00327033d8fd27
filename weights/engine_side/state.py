"""Everything the weight path keeps inside one vLLM worker, in one object. vLLM mixes
`WeightSyncExtension` into its own worker class, so state kept as the worker's attributes
would share that class's namespace; `worker_state(worker)` is the one attribute we add."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weights.engine_side.receiver import WeightChannel
from weights.engine_side.shadow import ShadowModel, supported
from weights.engine_side.staged_round import StagedRound
from weights.engine_side.vocab_in_place import VocabInPlace
from weights.formats.adapter import AdapterDirs

ATTRIBUTE = "_tether"


@dataclass
class WorkerState:
    rank: int
    weight_channel: WeightChannel | None = None
    """The long-lived group this worker receives rounds on (made at its first round)."""
    staged: StagedRound | None = None
    """The round received in the background (staged loads), until it is loaded or dropped."""
    shadow_model: ShadowModel | None = None
    shadow_checked: bool = False
    """Whether this engine supports a shadow model was asked (the answer is `shadow_model`)."""
    checksum: dict[str, float] | None = None
    """Of the weights loaded last, when tracked."""
    load_started: bool = False
    """Whether the load under way has put any tensor into the model (a failure then leaves
    the weights mixed)."""
    aliases: dict[str, list[str]] | None = None
    """The model's tied parameters under all their names, read before the first reload."""
    in_place: VocabInPlace | None = None
    """During a reload: the vocabulary layers a streamed tensor may arrive straight into."""
    base_weights: list[tuple[str, Any]] | None = None
    """An engine merging adapters: its initial weights, every merge starts from them."""
    adapter_dirs: AdapterDirs | None = None
    """An engine with vLLM's LoRA: the adapter directories written for `add_lora`."""

    def channel(self) -> WeightChannel:
        if self.weight_channel is None:
            self.weight_channel = WeightChannel(worker_rank=self.rank)
        return self.weight_channel

    def shadow(self, vllm_config: Any) -> ShadowModel | None:
        """This worker's shadow model (None where unsupported: GPU, graphs, vLLM's LoRA)."""
        if not self.shadow_checked:
            self.shadow_checked = True
            self.shadow_model = ShadowModel(vllm_config) if supported(vllm_config) else None
        return self.shadow_model


def worker_state(worker: Any) -> WorkerState:
    """The worker's state, made at its first use."""
    state = worker.__dict__.get(ATTRIBUTE)
    if state is None:
        state = WorkerState(rank=worker.rank)
        setattr(worker, ATTRIBUTE, state)
    return state
