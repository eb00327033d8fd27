"""TRL's side of bench/peer_trl.py: `GRPOTrainer` in its tools mode on the demo task.

Runs inside TRL's own virtual environment (bench/peer_trl.py makes it), with this
repository on PYTHONPATH for the pieces that must be the same on both sides: the
calculator's `add` (envservers/envs/calculator.py) as the tool, the env's answer rule
(envservers/rewards.py) as the reward. Nothing here imports torch-side Tether code.

    python -m bench.peer_trl_worker --model DIR --train ROWS.jsonl --out OUT [--steps 30]

Writes OUT/progress.jsonl: one `step` record per optimizer step (generation and
whole-step seconds), a `reward` record per step (its mean training reward), one
`checkpoint` record per saved model
(OUT/step_XXXX/, saved every `--save-every` steps with `save_pretrained`), each stamped
with `time.time()`, so the caller can put them on its own clock from launch.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common.tool_parsing import extract_tag
from envservers import rewards
from envservers.envs import calculator

REPO = Path(__file__).resolve().parents[1]


def add(a: float, b: float):
    """Add two numbers: a + b.

    Args:
        a: first operand
        b: second operand
    """
    # No return annotation: transformers would render a "return" key into the tool schema,
    # and the prompt would differ from the env server's spec (demo/tiny_model/tools.json).
    return calculator.add(a, b)


def answer_reward(completions, reward_spec, **kwargs) -> list[float]:
    """The calculator env's reward: the last assistant message (no tool call in it) holds
    `<answer>X</answer>` and X is right under the row's reward_spec; otherwise 0."""
    scores = []
    for messages, spec in zip(completions, reward_spec, strict=True):
        last = messages[-1]
        answer = None
        if last.get("role") == "assistant" and not last.get("tool_calls"):
            answer = extract_tag(last.get("content") or "", "answer")
        calls = [
            m.get("name", "")
            for m in messages
            if m.get("role") == "tool" and not str(m.get("content", "")).startswith("{'error'")
        ]
        rules = rewards.rules_from_spec(json.loads(spec))
        scores.append(0.0 if answer is None else rewards.score(answer, rules, calls))
    return scores


def load_rows(path: Path):
    """The dataset in the given order: conversational prompts plus the reward spec."""
    from datasets import Dataset

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Dataset.from_list(
        [{"prompt": r["prompt"], "reward_spec": json.dumps(r["reward_spec"])} for r in rows]
    )


def tokenizer_for_tools(model_dir: str, rows: list[dict]):
    """The tiny model's tokenizer with TRL's Hermes/Qwen response template (our chat format
    writes tool calls as Qwen's does; TRL knows it only by the Qwen templates' text), after
    checking that the `add` tool renders the prompt byte for byte as the env server's spec."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    spec = json.loads((Path(model_dir) / "tools.json").read_text())
    for row in rows[:4]:
        ours = tokenizer.apply_chat_template(row["prompt"], tools=spec, tokenize=False)
        theirs = tokenizer.apply_chat_template(row["prompt"], tools=[add], tokenize=False)
        assert ours == theirs, f"TRL's tool prompt differs:\n{theirs!r}\n!=\n{ours!r}"
    tokenizer.response_template = qwen3_template
    return tokenizer


def make_trainer(args, tokenizer, dataset, log):
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """Times generation (all tool-call rounds and rewards) inside each step."""

        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                log.generate_s += time.perf_counter() - started

    class Checkpoints(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kwargs):
            log.step_started = time.perf_counter()

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:  # logged after on_step_end of the same step
                log.write(kind="reward", step=state.global_step, reward=logs["reward"])

        def on_step_end(self, args_, state, control, model=None, **kwargs):
            log.step(state.global_step)
            if state.global_step % args.save_every == 0 or state.global_step == args.steps:
                path = Path(args.out) / f"step_{state.global_step:04d}"
                model.save_pretrained(path)
                log.write(kind="checkpoint", step=state.global_step, path=str(path))

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(Path(args.out) / "trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        # Per turn 64 tokens, as Tether's max_generate_length; the whole completion's budget
        # (turns + tool results) is left loose, as Tether's max_sequence_length is.
        generation_kwargs={"max_new_tokens": args.max_turn_tokens},
        max_completion_length=args.max_completion_tokens,
        max_tool_calling_iterations=args.max_turns - 1,
        beta=0.0,
        # TRL defaults to activation checkpointing; Tether's learner does not recompute, so
        # neither does TRL here (it makes TRL's steps faster, not slower).
        gradient_checkpointing=False,
        loss_type="dapo",  # token mean over the batch: Tether's `token_mean`
        scale_rewards="group",  # std-normalised group advantages: Tether's GRPO default
        mask_truncated_completions=True,  # Tether's DAPO overlong filtering
        shuffle_dataset=False,  # the rows come in Tether's release order
        use_cpu=True,
        seed=args.seed,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    return TimedGRPOTrainer(
        model=model,
        reward_funcs=[answer_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        tools=[add],
        callbacks=[Checkpoints()],
    )


class ProgressLog:
    """OUT/progress.jsonl, one flushed line per record."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a")
        self.generate_s = 0.0
        self.step_started = time.perf_counter()

    def write(self, **record) -> None:
        self.file.write(json.dumps({**record, "t": time.time()}) + "\n")
        self.file.flush()

    def step(self, step: int) -> None:
        self.write(
            kind="step",
            step=step,
            step_s=time.perf_counter() - self.step_started,
            generate_s=self.generate_s,
        )
        self.generate_s = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", type=Path, required=True, help="rows, in training order")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-turn-tokens", type=int, default=64)
    parser.add_argument("--max-completion-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    log = ProgressLog(args.out / "progress.jsonl")
    log.write(kind="start")
    dataset = load_rows(args.train)
    tokenizer = tokenizer_for_tools(args.model, list(dataset))
    trainer = make_trainer(args, tokenizer, dataset, log)
    log.write(kind="ready")
    trainer.train()
    log.write(kind="done")


if __name__ == "__main__":
    main()
