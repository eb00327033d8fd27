import math

import pytest
import torch

from learner.trainer.config import AlgorithmConfig
from learner.trainer.losses import (
    LossInputs,
    decoupled_behaviour_weight,
    entropy_from_logits,
    gspo_clip,
    kl_estimate,
    policy_loss,
    ppo_clip,
    token_logprobs,
    truncated_is_weight,
)
from learner.trainer.reductions import reduce_loss

RATIOS = [0.5, 0.9, 1.0, 1.1, 1.5]


def _inputs(**fields) -> LossInputs:
    n = len(fields["logprobs"])
    defaults = {
        "behaviour_logprobs": torch.zeros(n),
        "loss_mask": torch.ones(n, dtype=torch.bool),
        "seq_ids": torch.zeros(n, dtype=torch.int64),
        "num_seqs": 1,
    }
    return LossInputs(**{**defaults, **fields})


def test_ratio_one_is_the_plain_policy_gradient():
    """pi = pi_behaviour: loss = -A per token (here token_mean of -A), gradient -A per token."""
    logprobs = torch.tensor([-1.2, -0.3, -2.0, -0.7], requires_grad=True)
    advantages = torch.tensor([2.0, 2.0, -1.0, 0.5])
    inputs = _inputs(
        logprobs=logprobs, behaviour_logprobs=logprobs.detach().clone(), advantages=advantages
    )
    terms = policy_loss(inputs, AlgorithmConfig(eps_low=0.2, eps_high=0.28))
    assert terms.loss.tolist() == [-2.0, -2.0, 1.0, -0.5]
    loss = reduce_loss(terms.loss, inputs.loss_mask, inputs.seq_ids, 1, "token_mean")
    assert loss.item() == pytest.approx(-(2 + 2 - 1 + 0.5) / 4)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -advantages / 4)
    assert not terms.clipped.any()


def test_ppo_clip_by_hand_positive_advantage():
    """A = +1, eps_low .2, eps_high .28: only r > 1.28 is clipped (loss -1.28, no gradient)."""
    log_ratio = torch.log(torch.tensor(RATIOS)).requires_grad_()
    loss, ratio, clipped = ppo_clip(log_ratio, torch.ones(5), eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([-0.5, -0.9, -1.0, -1.1, -1.28]))
    assert clipped.tolist() == [False, False, False, False, True]
    loss.sum().backward()  # d(-r)/d log r = -r where unclipped
    torch.testing.assert_close(log_ratio.grad, torch.tensor([-0.5, -0.9, -1.0, -1.1, 0.0]))


def test_ppo_clip_by_hand_negative_advantage():
    """A = -1: only r < 0.8 is clipped (loss 0.8, no gradient); r = 1.5 keeps its 1.5."""
    log_ratio = torch.log(torch.tensor(RATIOS)).requires_grad_()
    loss, _, clipped = ppo_clip(log_ratio, -torch.ones(5), eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([0.8, 0.9, 1.0, 1.1, 1.5]))
    assert clipped.tolist() == [True, False, False, False, False]
    loss.sum().backward()
    torch.testing.assert_close(log_ratio.grad, torch.tensor([0.0, 0.9, 1.0, 1.1, 1.5]))


def test_ppo_clip_exact_bounds_are_not_clipped():
    log_ratio = torch.log(torch.tensor([0.8, 1.28], dtype=torch.float64))
    _, _, clipped_pos = ppo_clip(
        log_ratio, torch.ones(2, dtype=torch.float64), eps_low=0.2, eps_high=0.28
    )
    _, _, clipped_neg = ppo_clip(
        log_ratio, -torch.ones(2, dtype=torch.float64), eps_low=0.2, eps_high=0.28
    )
    assert not clipped_pos.any() and not clipped_neg.any()


def test_dual_clip_caps_negative_advantages_only():
    """c = 3: with A = -2 the loss of r = 5 (10) is capped at 6; r = 2 (4) is not; A > 0 is
    untouched (r = 5 with A = +2 -> -2 * 1.2)."""
    log_ratio = torch.log(torch.tensor([5.0, 2.0, 5.0])).requires_grad_()
    advantages = torch.tensor([-2.0, -2.0, 2.0])
    loss, _, clipped = ppo_clip(log_ratio, advantages, eps_low=0.2, eps_high=0.2, clip_ratio_c=3.0)
    torch.testing.assert_close(loss, torch.tensor([6.0, 4.0, -2.4]))
    assert clipped.tolist() == [True, False, True]
    loss.sum().backward()
    torch.testing.assert_close(log_ratio.grad, torch.tensor([0.0, 4.0, 0.0]))


def test_ppo_clip_matches_a_slow_loop():
    torch.manual_seed(0)
    log_ratio = torch.randn(200) * 0.4
    advantages = torch.randn(200)
    fast, _, _ = ppo_clip(log_ratio, advantages, eps_low=0.2, eps_high=0.28, clip_ratio_c=3.0)
    for lr, a, f in zip(log_ratio.tolist(), advantages.tolist(), fast.tolist(), strict=True):
        r = math.exp(lr)
        slow = max(-a * r, -a * min(max(r, 0.8), 1.28))
        if a < 0:
            slow = min(slow, -a * 3.0)
        assert f == pytest.approx(slow, rel=1e-5, abs=1e-6)


def test_truncated_and_decoupled_weights_by_hand():
    trainer = torch.log(torch.tensor([0.6, 0.2, 0.3]))
    engine = torch.log(torch.tensor([0.2, 0.4, 0.3]))  # weights 3, 0.5, 1
    torch.testing.assert_close(
        truncated_is_weight(trainer, engine, 2.0), torch.tensor([2.0, 0.5, 1.0])
    )
    torch.testing.assert_close(
        decoupled_behaviour_weight(trainer, engine, 2.0), torch.tensor([0.0, 0.5, 1.0])
    )
    torch.testing.assert_close(
        decoupled_behaviour_weight(trainer, engine, None), torch.tensor([3.0, 0.5, 1.0])
    )


def test_tis_ratio_is_against_the_trainer_and_weighted():
    """ppo, proximal anchor, tis weight capped at 2: ratio pi/pi_prox = 1.5 (not clipped
    with eps_high .6), weight min(pi_prox/pi_behaviour = 3, 2) = 2: loss = -A * 1.5 * 2."""
    prox = torch.log(torch.tensor([0.2]))
    inputs = _inputs(
        logprobs=torch.log(torch.tensor([0.3])),
        behaviour_logprobs=torch.log(torch.tensor([0.2 / 3])),
        proximal_logprobs=prox,
        advantages=torch.tensor([1.0]),
    )
    spec = AlgorithmConfig(
        eps_low=0.2, eps_high=0.6, ratio_anchor="proximal", importance_weight="tis", tis_cap=2.0
    )
    terms = policy_loss(inputs, spec)
    assert terms.loss.item() == pytest.approx(-3.0)
    assert terms.importance_weight.item() == pytest.approx(2.0)
    assert terms.ratio.item() == pytest.approx(1.5)


def test_decoupled_ppo_clips_against_proximal_and_masks_large_weights():
    """Token 0: r vs prox = 2 -> clipped at 1.2, weight 0.5 -> -0.6. Token 1: weight 4 > cap 3
    -> no loss at all."""
    inputs = _inputs(
        logprobs=torch.log(torch.tensor([0.4, 0.2])),
        proximal_logprobs=torch.log(torch.tensor([0.2, 0.2])),
        behaviour_logprobs=torch.log(torch.tensor([0.4, 0.05])),
        advantages=torch.tensor([1.0, 1.0]),
    )
    spec = AlgorithmConfig(
        ratio_anchor="proximal", importance_weight="decoupled", behaviour_weight_cap=3.0
    )
    terms = policy_loss(inputs, spec)
    torch.testing.assert_close(terms.loss, torch.tensor([-0.6, 0.0]))
    assert terms.clipped.tolist() == [True, False]
    with pytest.raises(ValueError, match="proximal_logprobs"):
        policy_loss(_inputs(logprobs=torch.zeros(1), advantages=torch.ones(1)), spec)


def test_anchor_and_weight_are_independent_choices():
    """Ratio against the behaviour logprobs (r = .3 / .1 = 3, clipped at 1.2) with the TIS
    weight min(pi_prox / pi_behaviour = 2, cap 5) = 2: loss = -A * 1.2 * 2. Proximal anchor
    without a weight: r = .3 / .2 = 1.5 -> clipped at 1.2, weight 1: loss -1.2."""
    inputs = _inputs(
        logprobs=torch.log(torch.tensor([0.3])),
        behaviour_logprobs=torch.log(torch.tensor([0.1])),
        proximal_logprobs=torch.log(torch.tensor([0.2])),
        advantages=torch.tensor([1.0]),
    )
    weighted = AlgorithmConfig(importance_weight="tis", tis_cap=5.0)
    assert policy_loss(inputs, weighted).loss.item() == pytest.approx(-2.4)
    anchored = AlgorithmConfig(ratio_anchor="proximal")
    assert policy_loss(inputs, anchored).loss.item() == pytest.approx(-1.2)
    assert weighted.needs_proximal and anchored.needs_proximal
    assert not AlgorithmConfig().needs_proximal


def test_gspo_by_hand():
    """Seq 0: token log-ratios .1, .3 -> s = e^.2 = 1.2214 > 1.2 with A = +1 -> clipped,
    loss -1.2. Seq 1: loss tokens -.2, -.4 (the first token is masked) -> s = e^-.3 = .7408,
    A = +1 -> unclipped, loss -.7408. seq_mean_token_mean = (-1.2 - .7408) / 2."""
    old = torch.zeros(5)
    logprobs = torch.tensor([0.1, 0.3, 9.0, -0.2, -0.4], requires_grad=True)
    mask = torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool)
    seq_ids = torch.tensor([0, 0, 1, 1, 1])
    loss, ratio, clipped = gspo_clip(
        logprobs, old, torch.ones(5), mask, seq_ids, 2, eps_low=0.2, eps_high=0.2
    )
    s1 = math.exp(-0.3)
    torch.testing.assert_close(ratio, torch.tensor([math.exp(0.2)] * 2 + [s1] * 3))
    assert clipped.tolist() == [True, True, False, False, False]
    total = reduce_loss(loss, mask, seq_ids, 2, "seq_mean_token_mean")
    assert total.item() == pytest.approx((-1.2 - s1) / 2, rel=1e-6)
    total.backward()
    # d/dlogp_t of -(1/2) exp(mean_t(logp_t)) over seq 1's two loss tokens = -(1/2) s1 (1/2)
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, 0.0, 0.0, -s1 / 4, -s1 / 4]))


def test_gspo_matches_a_slow_loop_value_and_gradient():
    torch.manual_seed(1)
    lengths = [3, 7, 1, 5]
    seq_ids = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))
    n = len(seq_ids)
    logprobs = (torch.randn(n) * 0.3 - 1).requires_grad_()
    old = logprobs.detach() + torch.randn(n) * 0.15
    mask = torch.rand(n) > 0.2
    mask[0] = True
    advantages_seq = torch.randn(4)
    fast, _, _ = gspo_clip(
        logprobs, old, advantages_seq[seq_ids], mask, seq_ids, 4, eps_low=0.1, eps_high=0.15
    )
    fast_total = reduce_loss(fast, mask, seq_ids, 4, "seq_mean_token_mean")
    (fast_grad,) = torch.autograd.grad(fast_total, logprobs)

    # The obvious version: GSPO's sequence objective, one sequence at a time.
    slow_logprobs = logprobs.detach().clone().requires_grad_()
    per_seq = []
    for s in range(4):
        tokens = [i for i in range(n) if seq_ids[i] == s and mask[i]]
        if not tokens:
            continue
        log_s = sum(slow_logprobs[i] - old[i] for i in tokens) / len(tokens)
        ratio = torch.exp(log_s)
        a = advantages_seq[s]
        per_seq.append(torch.maximum(-a * ratio, -a * ratio.clamp(0.9, 1.15)))
    slow_total = torch.stack(per_seq).mean()
    (slow_grad,) = torch.autograd.grad(slow_total, slow_logprobs)
    assert fast_total.item() == pytest.approx(slow_total.item(), rel=1e-5)
    torch.testing.assert_close(fast_grad, slow_grad, atol=1e-6, rtol=1e-5)


def test_kl_estimators_by_hand():
    logprobs = torch.log(torch.tensor([0.5, 0.5]))
    ref = torch.log(torch.tensor([0.25, 0.5]))  # log ratio = log 2, 0
    l2 = math.log(2)
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k1"), torch.tensor([l2, 0.0]))
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k2"), torch.tensor([l2**2 / 2, 0.0]))
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k3"), torch.tensor([0.5 - 1 + l2, 0.0]))


def test_kl_and_entropy_terms_add_to_the_loss():
    """Ratio 1, A = 0: the loss is only kl_coef * k3 - entropy_coef * H."""
    logprobs = torch.log(torch.tensor([0.5]))
    inputs = _inputs(
        logprobs=logprobs,
        behaviour_logprobs=logprobs,
        advantages=torch.zeros(1),
        ref_logprobs=torch.log(torch.tensor([0.25])),
        entropy=torch.tensor([2.0]),
    )
    spec = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01)
    terms = policy_loss(inputs, spec)
    assert terms.loss.item() == pytest.approx(0.1 * (0.5 - 1 + math.log(2)) - 0.02, abs=1e-7)


def test_masked_tokens_have_zero_loss_even_when_nan():
    inputs = _inputs(
        logprobs=torch.tensor([float("nan"), -1.0]),
        advantages=torch.tensor([1.0, 1.0]),
        loss_mask=torch.tensor([False, True]),
    )
    terms = policy_loss(inputs, AlgorithmConfig())
    assert terms.loss[0].item() == 0.0 and terms.loss[1].item() == pytest.approx(-math.exp(-1.0))


def test_token_logprobs_and_entropy_by_hand():
    logits = torch.tensor([[0.0, 0.0, math.log(2.0)]])  # probabilities 1/4, 1/4, 1/2
    assert token_logprobs(logits, torch.tensor([2])).item() == pytest.approx(math.log(0.5))
    expected_entropy = -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))
    assert entropy_from_logits(logits).item() == pytest.approx(expected_entropy)


def test_algorithm_rejects_bad_settings():
    with pytest.raises(ValueError, match="greater than 1"):
        AlgorithmConfig(clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="policy_loss"):
        AlgorithmConfig(policy_loss="reinforce")
    assert AlgorithmConfig(importance_weight="decoupled").needs_proximal
