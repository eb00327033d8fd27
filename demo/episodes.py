"""Play calculator episodes with a transformers model and measure sampled pass@1.

An oracle for the rest of Tether (no vLLM, no env server, no bus): each episode is templated
once, every assistant turn is sampled until `<|im_end|>`, tool calls run in the in-process
calculator (demo/calculator.py), and each observation is appended as a templated delta,
exactly as the rollout actor builds its token history. Episodes are batched turn by turn.

    prompts ──► sample turn (batched, left-padded) ──► calculator.step ──► delta ──┐
       ▲                                                                           │
       └──────────────────────── while any episode is not done ◄───────────────────┘
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from demo.calculator import CalculatorEpisode
from demo.chat_template import IM_END, observation_delta
from demo.data import DEMO_TOOLS


@dataclass
class EpisodeResult:
    task_key: str
    reward: float
    num_turns: int
    num_tool_calls: int
    tool_errors: int
    token_ids: list[int]


def _sample_turns(
    model: Any,
    histories: list[list[int]],
    *,
    pad_id: int,
    eos_id: int,
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
) -> list[list[int]]:
    """Sample one assistant turn per history; each result ends at EOS (inclusive) or at the
    token limit."""
    turns: list[list[int]] = []
    for begin in range(0, len(histories), batch_size):
        chunk = histories[begin : begin + batch_size]
        width = max(len(h) for h in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [B, T]
        attention = torch.zeros((len(chunk), width), dtype=torch.long)  # [B, T]
        for row, history in enumerate(chunk):
            input_ids[row, width - len(history) :] = torch.tensor(history)
            attention[row, width - len(history) :] = 1
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
        )
        for generated in output[:, width:].tolist():  # [B, T_new]
            turns.append(
                generated[: generated.index(eos_id) + 1] if eos_id in generated else generated
            )
    return turns


@torch.no_grad()
def play_episodes(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    *,
    num_samples: int = 1,
    seed: int = 0,
    temperature: float = 1.0,
    max_turns: int = 4,
    max_new_tokens: int = 48,
    batch_size: int = 64,
) -> list[EpisodeResult]:
    """`num_samples` episodes per row (rows in SkyRL format), played to the end."""
    torch.manual_seed(seed)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.pad_token_id
    keys, histories, episodes = [], [], []
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            row["prompt"], tools=DEMO_TOOLS, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        spec = row["reward_spec"]
        for _ in range(num_samples):
            keys.append(row["extra_info"]["task_key"])
            histories.append(list(prompt_ids))
            episodes.append(
                CalculatorEpisode(
                    ground_truth=str(spec["ground_truth"]),
                    must_call_tool=bool(spec.get("must_call_tool", False)),
                )
            )
    num_turns = [0] * len(episodes)
    for _ in range(max_turns):
        active = [i for i, episode in enumerate(episodes) if not episode.done]
        if not active:
            break
        turns = _sample_turns(
            model,
            [histories[i] for i in active],
            pad_id=pad_id,
            eos_id=eos_id,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
        )
        for i, turn in zip(active, turns, strict=True):
            histories[i] += turn
            num_turns[i] += 1
            observations = episodes[i].step(tokenizer.decode(turn, skip_special_tokens=True))
            if observations:
                closing = "" if turn and turn[-1] == eos_id else IM_END
                delta = closing + observation_delta(observations)
                histories[i] += tokenizer.encode(delta, add_special_tokens=False)
    return [
        EpisodeResult(
            task_key=key,
            reward=episode.reward,  # an episode cut by max_turns keeps reward 0.0
            num_turns=turns,
            num_tool_calls=episode.num_tool_calls,
            tool_errors=episode.tool_errors,
            token_ids=history,
        )
        for key, episode, turns, history in zip(keys, episodes, num_turns, histories, strict=True)
    ]


def measure_pass_at_1(
    model_dir: str | Path, eval_rows: list[dict[str, Any]], n: int = 4, seed: int = 0
) -> float:
    """Sampled pass@1 (temperature 1.0): mean reward over `n` episodes per eval row."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = play_episodes(model, tokenizer, eval_rows, num_samples=n, seed=seed)
    return sum(r.reward for r in results) / len(results)
