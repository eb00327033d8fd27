"""The training step on one process (no torch.distributed): packing, the ratio-1 limit against
a hand-written REINFORCE + AdamW step, micro-batch invariance, NaN skipping, checkpoints,
weight buckets. The 2-rank FSDP2 acceptance test is in test_trainer_distributed.py."""

import dataclasses

import numpy as np
import pytest
import torch

from learner.trainer.checkpoint import TrainingState, latest_checkpoint, prune_checkpoints
from learner.trainer.losses import token_logprobs
from learner.trainer.trainer import TooManySkippedSteps, Trainer
from tests.learner.builders import learner_config, random_samples, tiny_qwen2


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# Adam's first update is lr * g / (|g| + eps): with the default eps, a 1e-9 float difference
# in a near-zero gradient element moves that weight by up to lr. Equivalence tests compare
# gradients through the update, so they use an eps that keeps the update linear in tiny g.
LINEAR_ADAM = {"eps": 1e-4}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def _separate_logprobs(model, sample) -> torch.Tensor:
    """The obvious reference: one plain (sdpa) forward of the sample alone."""
    ids = torch.from_numpy(sample.token_ids.astype(np.int64))
    logits = model(input_ids=ids[None], use_cache=False).logits[0]
    return token_logprobs(logits[:-1], ids[1:])  # logprobs of tokens 1..T-1


def _own_logprobs(trainer: Trainer, sample) -> np.ndarray:
    """The trainer's logprob of each of `sample`'s tokens `[T]` (0 off the loss mask), as
    behaviour logprobs that make every ratio exactly 1."""
    (batch,), _ = trainer.micro_batches([sample])
    (logprobs,) = trainer.compute_logprobs([batch])
    own = np.zeros(sample.num_tokens, dtype=np.float32)
    own[batch.token_index.numpy()] = logprobs.numpy()
    return own


def test_trainer_logprobs_equal_one_forward_per_sequence():
    trainer = Trainer(tiny_qwen2(), learner_config(micro_batch_tokens=10_000))
    samples = random_samples(num_samples=4, seed=1)
    batches, _ = trainer.micro_batches(samples)
    (packed,) = trainer.compute_logprobs(batches)
    reference = tiny_qwen2()  # the same initial weights, on transformers' own attention
    (batch,) = batches
    for k, index in enumerate(batch.sample_indices):
        sample = samples[index]
        rows = (batch.seq_ids == k).nonzero().squeeze(1)
        positions = batch.token_index[rows].numpy()
        expected = _separate_logprobs(reference, sample).detach()[positions - 1]
        torch.testing.assert_close(packed[rows], expected, atol=2e-6, rtol=0)


def test_ratio_one_step_equals_reinforce_with_adamw_by_hand():
    """Behaviour logprobs = the model's own: ratio 1, so the PPO step must be exactly the
    textbook policy gradient -sum(A * log pi) / num_loss_tokens, clipped to norm 1, AdamW."""
    config = learner_config(micro_batch_tokens=50, optim=LINEAR_ADAM)
    trainer = Trainer(tiny_qwen2(), config)
    samples = random_samples(num_samples=6, seed=3)
    samples = [
        dataclasses.replace(s, behaviour_logprobs=_own_logprobs(trainer, s)) for s in samples
    ]
    metrics = trainer.train_step(samples)

    num_loss_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    expected_loss = -sum(s.advantage * int(s.loss_mask.sum()) for s in samples) / num_loss_tokens
    assert metrics["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["ratio_std"] < 1e-6 and metrics["clip_fraction"] == 0.0
    assert metrics["version"] == 1 and metrics["skipped"] == 0

    reference = tiny_qwen2()
    surrogate = 0.0
    for s in samples:
        mask = torch.from_numpy(s.loss_mask[1:].astype(np.float32))
        surrogate = surrogate - (s.advantage * mask * _separate_logprobs(reference, s)).sum()
    (surrogate / num_loss_tokens).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    assert metrics["grad_norm"] == pytest.approx(grad_norm.item(), rel=1e-4)
    decay = [p for p in reference.parameters() if p.ndim >= 2]
    no_decay = [p for p in reference.parameters() if p.ndim < 2]
    torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        eps=LINEAR_ADAM["eps"],
    ).step()
    assert _max_diff(_params(trainer.model), _params(reference)) < 1e-6


def test_unchanged_ratios_after_an_update_are_flagged_degenerate():
    """The seeds' month-long bug: 'behaviour' logprobs recomputed by the trainer itself. The
    tokens say version 0 but the learner is at version 1, and every ratio is exactly 1."""
    trainer = Trainer(tiny_qwen2(), learner_config())
    samples = random_samples(num_samples=4, seed=3)
    trainer.train_step(samples)
    recomputed = [
        dataclasses.replace(s, behaviour_logprobs=_own_logprobs(trainer, s)) for s in samples
    ]
    assert trainer.train_step(recomputed)["degenerate_ratio"] == 1.0
    assert trainer.train_step(samples)["degenerate_ratio"] == 0.0


@pytest.mark.parametrize(
    "algorithm",
    [
        {"loss_reduction": "token_mean"},
        {"loss_reduction": "seq_mean_token_sum", "clip_ratio_c": 3.0},
        {"policy_loss": "gspo", "loss_reduction": "seq_mean_token_mean"},
    ],
)
def test_micro_batch_budget_does_not_change_the_update(algorithm):
    samples = random_samples(num_samples=8, seed=4)
    results = []
    for budget in (1000, 45):
        config = learner_config(micro_batch_tokens=budget, algorithm=algorithm, optim=LINEAR_ADAM)
        trainer = Trainer(tiny_qwen2(), config)
        metrics = trainer.train_step(samples)
        results.append((metrics, _params(trainer.model)))
    (one, params_one), (many, params_many) = results
    assert one["num_micro_batches"] == 1 and many["num_micro_batches"] >= 4
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert _max_diff(params_one, params_many) < 1e-6


def test_non_finite_loss_skips_the_step_and_too_many_stop_training():
    trainer = Trainer(tiny_qwen2(), learner_config(nan_skip_limit=2))
    before = _params(trainer.model)
    poisoned = [
        dataclasses.replace(s, advantage=float("nan")) for s in random_samples(num_samples=3)
    ]
    metrics = trainer.train_step(poisoned)
    assert (
        metrics["skipped"] == 1.0 and metrics["version"] == 0 and metrics["consecutive_skips"] == 1
    )
    assert _max_diff(before, _params(trainer.model)) == 0.0
    assert all(p.grad is None for p in trainer.model.parameters())
    with pytest.raises(TooManySkippedSteps, match="2 consecutive steps") as stopped:
        trainer.train_step(poisoned)
    assert stopped.value.metrics["skipped"] == 1.0

    recovered = Trainer(tiny_qwen2(), learner_config(nan_skip_limit=2))
    recovered.train_step(poisoned)
    assert recovered.train_step(random_samples(num_samples=3))["consecutive_skips"] == 0
    assert recovered.version == 1 and recovered.step == 2


def test_checkpoint_round_trip_continues_identically(tmp_path):
    config = learner_config(optim={"warmup_steps": 3}, algorithm={"entropy_coef": 0.01})
    batch_1, batch_2 = random_samples(num_samples=5, seed=5), random_samples(num_samples=5, seed=6)
    trainer = Trainer(tiny_qwen2(), config)
    trainer.train_step(batch_1)
    saved_params = _params(trainer.model)
    saved_optim = {
        k: {n: t.clone() for n, t in v.items()} for k, v in trainer.optimizer.state.items()
    }
    path = trainer.save(
        tmp_path, TrainingState(dataset_cursor={"epoch": 0, "index": 5}, trained_ids=["a", "b"])
    )
    expected = trainer.train_step(batch_2)

    resumed = Trainer(tiny_qwen2(seed=7), config)
    state = resumed.load(path)
    assert (state.step, state.version, state.trained_ids) == (1, 1, ["a", "b"])
    assert state.dataset_cursor == {"epoch": 0, "index": 5}
    assert _max_diff(saved_params, _params(resumed.model)) == 0.0
    for param, old_param in zip(resumed.optimizer.state, saved_optim, strict=True):
        for name, tensor in saved_optim[old_param].items():
            assert torch.equal(resumed.optimizer.state[param][name], tensor), name
    assert resumed.scheduler.get_last_lr() == pytest.approx([1e-3 * 2 / 3] * 2)
    got = resumed.train_step(batch_2)
    assert got["loss"] == expected["loss"] and got["lr"] == expected["lr"]
    assert _max_diff(_params(trainer.model), _params(resumed.model)) == 0.0
    assert resumed.version == trainer.version == 2


def test_a_resume_makes_adams_state_without_an_optimizer_step(tmp_path, monkeypatch):
    """torch's `get_state_dict` would make a fresh optimizer's state by one whole step on
    zero gradients; the load makes it directly (the test above: still identical)."""
    config = learner_config()
    trainer = Trainer(tiny_qwen2(), config)
    trainer.train_step(random_samples(num_samples=3, seed=8))
    path = trainer.save(tmp_path, TrainingState())
    resumed = Trainer(tiny_qwen2(seed=9), config)
    monkeypatch.setattr(resumed.optimizer, "step", lambda *a, **k: pytest.fail("a step ran"))
    resumed.load(path)
    assert _max_diff(_params(trainer.model), _params(resumed.model)) == 0.0


def test_latest_and_prune_ignore_incomplete_checkpoints(tmp_path):
    trainer = Trainer(tiny_qwen2(), learner_config())
    assert latest_checkpoint(tmp_path) is None
    for _ in range(3):
        trainer.train_step(random_samples(num_samples=2))
        trainer.save(tmp_path, TrainingState())
    (tmp_path / "step_00000009").mkdir()  # an interrupted save: no state.json
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step_00000001"]
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        trainer.load(tmp_path / "step_00000009")


def test_full_weights_stream_every_parameter_once():
    trainer = Trainer(tiny_qwen2(tie_word_embeddings=True), learner_config())
    names = [name for name, _ in trainer.full_weights()]
    assert len(names) == len(set(names))
    streamed = dict(trainer.full_weights())
    assert streamed.keys() == dict(trainer.model.named_parameters()).keys()
    assert "lm_head.weight" not in streamed  # tied: vLLM fills it from the embedding
    assert _max_diff(streamed, _params(trainer.model)) == 0.0
    half = [t for _, t in trainer.full_weights(dtype=torch.bfloat16)]
    assert all(t.dtype == torch.bfloat16 for t in half)


def test_bf16_step_is_close_to_fp32():
    samples = random_samples(num_samples=4, seed=8)
    fp32 = Trainer(tiny_qwen2(), learner_config()).train_step(samples)
    bf16 = Trainer(tiny_qwen2(), learner_config(dtype="bf16")).train_step(samples)
    assert bf16["skipped"] == 0.0
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=2e-2)
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.1)
