"""Measure a tiny model on the demo task the way the actors play it: the rollout code of
actors/episode.py with transformers as the engine (actors/hf_engine.py) against the env
server's real calculator, in process. Sampled, as pass@1 must be."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout
from actors.group import run_group
from actors.hf_engine import HFEngine
from learner.dispatcher import task_from_row
from tests.fakes import InProcessEnv

# The demo's episode limits (configs/demo.toml [actor.rollout]).
DEMO_LIMITS = RolloutConfig(
    max_turns=3, max_input_length=512, max_generate_length=64, max_sequence_length=768
)


@dataclass(frozen=True)
class WarmStartStats:
    pass_at_1: float
    call_rate: float
    """Fraction of episodes that called a tool."""
    called_right: float
    """Fraction of the episodes that called a tool and answered right."""
    num_episodes: int
    num_called: int


def measure(model_dir: str | Path, rows: list[dict], *, samples: int = 2, seed: int = 0):
    """Play `samples` episodes per row (temperature 1, seeded) and summarise them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    chat, env = ChatTemplate(tokenizer), InProcessEnv()

    async def play(index: int, row: dict):
        task = task_from_row(
            row, task_id=f"warm-{index}", step=0, min_version=0, group_size=samples
        )
        return await run_group(
            Rollout(
                engine=engine,
                env=env,
                chat=chat,
                limits=DEMO_LIMITS,
                sampling=SamplingConfig(temperature=1.0, seed=seed + samples * index),
                env_config=EnvConfig(),
            ),
            task,
        )

    async def play_all():
        return await asyncio.gather(*(play(i, row) for i, row in enumerate(rows)))

    results = [r for group in asyncio.run(play_all()) for r in group]
    called = [r for r in results if r.num_tool_calls > 0]
    return WarmStartStats(
        pass_at_1=sum(r.reward for r in results) / len(results),
        call_rate=len(called) / len(results),
        called_right=sum(r.reward for r in called) / max(len(called), 1),
        num_episodes=len(results),
        num_called=len(called),
    )
