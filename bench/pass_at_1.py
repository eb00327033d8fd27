"""One evaluator for checkpoints of any trainer: sampled pass@1 on the demo's held-out
calculator questions, played through Tether's rollout code (actors/episode.py) on one vLLM
engine against the real calculator environment, in process.

bench/peer_trl.py scores TRL's saved models and Tether's weight snapshots with it, and
bench/staleness.py its runs' final weights, so every pass@1 they compare comes from the
same procedure: the same rows, the same episode limits as configs/demo.toml, temperature
1, and the same sampling seed per (question, sample) for every checkpoint (common random
numbers: the difference between two checkpoints is less noisy than either figure).

    evaluator = await Evaluator.start(base_model_dir, cpu_core="1")
    pass1 = await evaluator.pass_at_1(rows)                     # the base weights
    pass1 = await evaluator.pass_at_1(rows, weights=ckpt_dir)  # any dir of *.safetensors
    evaluator.shutdown()
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig, VllmEngineConfig
from actors.episode import Rollout
from actors.group import run_group
from broker.wire import PromptTask
from demo.engine import tiny_engine_settings
from learner.dispatcher import task_from_row

# configs/demo.toml [actor.rollout]
DEMO_LIMITS = RolloutConfig(
    max_turns=3, max_input_length=512, max_generate_length=64, max_sequence_length=768
)
EVAL_SEED = 1_000_003


def eval_task(index: int, row: dict, samples: int) -> PromptTask:
    return task_from_row(row, task_id=f"eval-{index}", step=0, min_version=0,
                         group_size=samples, is_eval=True)  # fmt: skip


class Evaluator:
    def __init__(self, engine, chat: ChatTemplate, env) -> None:
        self.engine, self.chat, self.env = engine, chat, env
        self.num_loaded = 0

    @classmethod
    async def start(
        cls, model_dir: str | Path, *, cpu_core: str = "nobind", providers: dict | None = None
    ) -> Evaluator:
        """An engine on `model_dir` (its tokenizer and config; weights are swapped per
        checkpoint), its OpenMP threads bound to `cpu_core`, playing against the env
        `providers` by env_class (default: the calculator)."""
        from transformers import AutoTokenizer

        from actors.vllm_engine import VllmEngine
        from envservers.envs.calculator import CalculatorProvider
        from tests.fakes import InProcessEnv

        engine = await VllmEngine.start(
            VllmEngineConfig(
                **tiny_engine_settings(model_dir, max_num_seqs=64), cpu_threads_bind=cpu_core
            )
        )
        chat = ChatTemplate(AutoTokenizer.from_pretrained(model_dir))
        providers = providers or {"calculator": CalculatorProvider()}
        return cls(engine, chat, InProcessEnv(providers=providers))

    def rollout(self, *, seed: int) -> Rollout:
        """Episodes on this engine and env with the demo's limits, at temperature 1, with
        sample i of a group seeded `seed + i`."""
        return Rollout(
            engine=self.engine,
            env=self.env,
            chat=self.chat,
            limits=DEMO_LIMITS,
            sampling=SamplingConfig(temperature=1.0, seed=seed),
            env_config=EnvConfig(),
        )

    async def pass_at_1(
        self, rows: list[dict], *, weights: str | Path | None = None, samples: int = 2
    ) -> float:
        """Mean reward of `samples` seeded episodes per row, with the engine's current
        weights or those in `weights` (a directory of *.safetensors in HF names)."""
        if weights is not None:
            self.num_loaded += 1
            await self.engine.load_snapshot(str(weights), self.num_loaded)

        async def play(index: int, row: dict):
            rollout = self.rollout(seed=EVAL_SEED + samples * index)
            return await run_group(rollout, eval_task(index, row, samples))

        groups = await asyncio.gather(*(play(i, row) for i, row in enumerate(rows)))
        results = [r for group in groups for r in group]
        return sum(r.reward for r in results) / len(results)

    def shutdown(self) -> None:
        self.engine.shutdown()
