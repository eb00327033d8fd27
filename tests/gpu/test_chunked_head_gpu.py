"""The chunked language-model head on CUDA against the plain one (learner/trainer/
chunked_head.py): at a real vocabulary (Qwen2's 151,936 rows, hidden 896), values and
gradients, in fp32 (no TF32) tightly and in bf16 (the learner's compute dtype on GPUs)
within what bf16 products allow. On CPU tests/learner/test_chunked_head.py covers the same
at small sizes; here cuBLAS picks its kernels per chunk's row count, which CPU cannot show."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from learner.trainer.chunked_head import chunk_rows, head_terms
from tests.gpu.conftest import need_gpus

pytestmark = [pytest.mark.gpu]
ROWS, HIDDEN, VOCAB, LOSS_TOKENS = 2048, 896, 151_936, 1536


def _inputs(dtype):
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(ROWS, HIDDEN, device="cuda", generator=generator).to(dtype)
    weight = (0.02 * torch.randn(VOCAB, HIDDEN, device="cuda", generator=generator)).to(dtype)
    token_row = torch.randint(0, ROWS, (LOSS_TOKENS,), device="cuda", generator=generator)
    targets = torch.randint(0, VOCAB, (LOSS_TOKENS,), device="cuda", generator=generator)
    return hidden.requires_grad_(), weight.requires_grad_(), token_row, targets


def _plain(hidden, weight, token_row, targets):
    logits = F.linear(hidden, weight).float()
    lse = torch.logsumexp(logits, dim=-1)
    log_p = torch.log_softmax(logits, dim=-1)
    return logits[token_row, targets] - lse[token_row], -(log_p.exp() * log_p).sum(-1)


def _chunked(hidden, weight, token_row, targets):
    rows = chunk_rows(VOCAB, 128)
    lse, entropy, picked = head_terms(
        hidden, weight, None, token_row, targets, rows=rows, with_entropy=True
    )
    return picked - lse[token_row], entropy


def _values_and_grads(head, dtype):
    hidden, weight, token_row, targets = _inputs(dtype)
    logprobs, entropy = head(hidden, weight, token_row, targets)
    (logprobs.sum() + 0.01 * entropy.sum()).backward()
    return logprobs.detach(), entropy.detach(), hidden.grad.float(), weight.grad.float()


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float32, 2e-4), (torch.bfloat16, 2e-2)],
    ids=["fp32", "bf16"],
)
def test_chunked_head_equals_plain_on_cuda(dtype, tolerance):
    need_gpus(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    expected = _values_and_grads(_plain, dtype)
    got = _values_and_grads(_chunked, dtype)
    for name, a, b in zip(["logprobs", "entropy", "d_hidden", "d_weight"], got, expected,
                          strict=True):  # fmt: skip
        scale = b.abs().max().item()
        gap = (a - b).abs().max().item()
        assert gap <= tolerance * max(scale, 1.0), f"{name}: max gap {gap:.3g}, scale {scale:.3g}"
