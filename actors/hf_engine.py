"""The Engine interface on plain transformers: the obvious, slow reference implementation.

It samples each request on its own (`model.generate`, no batching, no KV reuse between
turns), so it is for tests and small measurements, not for throughput: the warm-start
measurement of the demo model plays its episodes through the same rollout code the actors
run (actors/episode.py) with this engine standing in for vLLM. Requests are served one at a
time in a worker thread; a seeded request reseeds torch's generator, so a seeded episode
replays exactly on the same machine.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from actors.types import Generation, Turn


class HFEngine:
    def __init__(self, model: Any, *, version: int = 0) -> None:
        self.model = model.eval()
        self.version = version
        self._lock = asyncio.Lock()

    async def generate(self, prompt_token_ids: list[int], turn: Turn) -> Generation:
        async with self._lock:
            return await asyncio.to_thread(self._generate, list(prompt_token_ids), turn)

    @torch.no_grad()
    def _generate(self, prompt: list[int], turn: Turn) -> Generation:
        if turn.seed is not None:
            torch.manual_seed(turn.seed)
        sampling, stop_token_ids = turn.sampling, turn.stop_token_ids
        greedy = sampling.temperature == 0
        output = self.model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else 0,
            max_new_tokens=turn.max_tokens,
            eos_token_id=list(stop_token_ids) or None,
            pad_token_id=self.model.config.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        token_ids = output.sequences[0, len(prompt) :].tolist()  # [T_new]
        # `scores` are the processed logits the token was sampled from (temperature, top-p):
        # their log-softmax at the sampled token is the behaviour logprob, as vLLM reports.
        logprobs = [
            torch.log_softmax(scores[0].float(), dim=-1)[token].item()
            for scores, token in zip(output.scores, token_ids, strict=False)
        ]
        stops = set(stop_token_ids)
        if stops and any(t in stops for t in token_ids):
            end = next(i for i, t in enumerate(token_ids) if t in stops) + 1
            token_ids, logprobs, finish = token_ids[:end], logprobs[:end], "stop"
        else:
            finish = "length"
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            versions=[self.version] * len(token_ids),
        )
