"""The chunked language-model head (learner/trainer/chunked_head.py) against the plain one:
logsumexp, entropy and target logits, their gradients (hidden rows, weight, bias), at chunk
sizes from one row to more than all, and through the model (`forward_loss_tokens` with
`head_chunk_mb`) on the tiny Qwen2, tied and untied. And what each path keeps for backward:
the plain head a `[U, V]` float32 tensor or more, the chunked one nothing of that size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from learner.trainer.chunked_head import chunk_budget_mb, chunk_rows, head_terms
from learner.trainer.prefix_plan import plan_pieces
from learner.trainer.segment_forward import forward_loss_tokens
from learner.trainer.segments import collate_segments
from tests.learner.segment_builders import group
from tests.learner.test_segment_forward import _models

U, H, V, L = 37, 16, 101, 50


def _inputs(seed: int, *, bias: bool):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(U, H, generator=generator, requires_grad=True)
    weight = torch.randn(V, H, generator=generator, requires_grad=True)
    b = torch.randn(V, generator=generator, requires_grad=True) if bias else None
    token_row = torch.randint(0, U, (L,), generator=generator)
    targets = torch.randint(0, V, (L,), generator=generator)
    return hidden, weight, b, token_row, targets


def _plain(hidden, weight, bias, token_row, targets):
    logits = F.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    log_p = torch.log_softmax(logits, dim=-1)
    return logits[token_row, targets] - lse[token_row], -(log_p.exp() * log_p).sum(-1)[token_row]


def _chunked(rows):
    def run(hidden, weight, bias, token_row, targets):
        lse, entropy, picked = head_terms(
            hidden, weight, bias, token_row, targets, rows=rows, with_entropy=True
        )
        return picked - lse[token_row], entropy[token_row]

    return run


def _values_and_grads(head, inputs):
    hidden, weight, bias, token_row, targets = inputs
    logprobs, entropy = head(*inputs)
    generator = torch.Generator().manual_seed(99)
    upstream = torch.randn(2, L, generator=generator)
    loss = (logprobs * upstream[0]).sum() + (entropy * upstream[1]).sum()
    params = [hidden, weight] + ([bias] if bias is not None else [])
    return [logprobs.detach(), entropy.detach(), *torch.autograd.grad(loss, params)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 36, 1000])
def test_chunked_equals_plain_values_and_gradients(rows, bias):
    inputs = _inputs(3, bias=bias)
    expected = _values_and_grads(_plain, inputs)
    got = _values_and_grads(_chunked(rows), inputs)
    for name, a, b in zip(["logprobs", "entropy", "d_hidden", "d_weight", "d_bias"], got, expected,
                          strict=False):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_without_entropy_the_entropy_is_zero_and_lse_still_right():
    hidden, weight, _, token_row, targets = _inputs(4, bias=False)
    lse, entropy, _ = head_terms(hidden, weight, None, token_row, targets, rows=5,
                                 with_entropy=False)  # fmt: skip
    torch.testing.assert_close(lse, torch.logsumexp(hidden @ weight.T, -1), rtol=1e-6, atol=1e-6)
    assert not entropy.any()


def test_chunk_rows_follow_the_budget():
    assert chunk_rows(152_064, 256) == 256 * 2**20 // (152_064 * 16)  # 110 rows
    assert chunk_rows(152_064, 0.001) == 1


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("entropy", ["none", "detached", "grad"])
def test_through_the_model_the_chunked_head_equals_the_plain_one(tied, entropy):
    samples = [
        *group(group_id="a", prefix_len=24, suffix_lens=[9, 1, 17, 4], seed=1),
        *group(group_id="b", prefix_len=30, suffix_lens=[12, 6, 20], seed=2),
    ]
    ((pieces,),) = plan_pieces(samples, num_ranks=1, token_budget=512)
    batch = collate_segments(samples, pieces)
    results = []
    for chunk_mb in (None, 0.02):  # 0.02 MB: a few rows per chunk at the tiny vocabulary
        _, model = _models(tied=tied)
        logprobs, token_entropy = forward_loss_tokens(
            model, batch, entropy=entropy, head_chunk_mb=chunk_mb
        )
        loss = logprobs.sum() + (token_entropy.sum() if entropy == "grad" else 0)
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs.detach(), token_entropy, grads))
    (plain_lp, plain_h, plain_g), (lp, h, g) = results
    torch.testing.assert_close(lp, plain_lp, rtol=1e-5, atol=1e-5)
    if entropy == "none":
        assert h is None and plain_h is None
    else:
        torch.testing.assert_close(h.detach(), plain_h.detach(), rtol=1e-5, atol=1e-5)
        assert h.requires_grad == (entropy == "grad")
    assert g.keys() == plain_g.keys()
    for name in g:
        torch.testing.assert_close(g[name], plain_g[name], rtol=1e-4, atol=1e-5, msg=name)
    _, model = _models(tied=tied)
    head = model.get_output_embeddings()
    assert "forward" not in vars(head)  # the head's own forward is back


def _largest_saved_for_backward(head) -> int:
    """Elements of the largest tensor autograd keeps for backward in one head call."""
    inputs = _inputs(5, bias=False)
    largest = 0

    def pack(tensor):
        nonlocal largest
        largest = max(largest, tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        head(*inputs)
    return largest


def test_the_chunked_head_keeps_nothing_the_size_of_the_logits():
    assert _largest_saved_for_backward(_plain) >= U * V
    assert _largest_saved_for_backward(_chunked(4)) == V * H  # the weight itself


def _weight_grads_made(head) -> list[int]:
    """Sizes of the gradients that reach the weight (autograd sums them if several)."""
    inputs = _inputs(6, bias=False)
    sizes = []
    inputs[1].register_hook(lambda grad: sizes.append(grad.numel()))
    logprobs, entropy = head(*inputs)
    (logprobs.sum() + entropy.sum()).backward()
    return sizes


def test_one_weight_gradient_not_two_summed():
    """A target logit taken by indexing the weight would send a second, dense `[V, H]`
    gradient for autograd to sum with the first: at the 0.5B shape 0.5 GB each."""
    assert _weight_grads_made(_chunked(4)) == [V * H]


def test_an_empty_micro_batch_still_reaches_every_parameter():
    """FSDP's reduce-scatter needs every rank's backward, a rank without data included."""
    _, model = _models()
    logprobs, entropy = forward_loss_tokens(
        model, collate_segments([], []), entropy="grad", head_chunk_mb=0.02
    )
    assert logprobs.shape == entropy.shape == (0,)
    (logprobs.sum() + entropy.sum()).backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_under_autocast_the_products_run_in_its_dtype_like_the_plain_head():
    """bf16 autocast (a 1-GPU learner; here on CPU): both heads multiply in bf16 and reduce
    in float32, so they agree to bf16 rounding, and the gradients keep their own dtypes."""
    inputs = _inputs(7, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = _values_and_grads(_plain, inputs)
        got = _values_and_grads(_chunked(5), inputs)
    assert got[0].dtype == torch.float32 and got[3].dtype == inputs[1].dtype  # fp32 master
    for name, a, b in zip(["logprobs", "entropy", "d_hidden", "d_weight"], got, expected,
                          strict=True):  # fmt: skip
        torch.testing.assert_close(a, b.to(a.dtype), rtol=3e-2, atol=3e-2, msg=name)


def test_auto_budget_is_larger_on_a_gpu_and_an_explicit_one_is_kept():
    assert chunk_budget_mb("auto", torch.device("cpu")) == 128
    assert chunk_budget_mb("auto", torch.device("cuda", 1)) == 1024
    assert chunk_budget_mb(64.0, torch.device("cuda")) == 64
    assert chunk_budget_mb(None, torch.device("cpu")) is None  # the plain head
