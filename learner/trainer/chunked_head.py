"""The language-model head over a real vocabulary without its `[U, V]` logits.

What the loss needs from the head is, per hidden row, the log-normaliser (logsumexp) and,
with an entropy term, the entropy; per loss token, the logit of its target. With V = 152,064
(Qwen's vocabulary) and U = 16,384 rows one float32 `[U, V]` tensor is 10 GB, and the plain
path keeps several (the logits, log_softmax, its exp) for backward. Here

- `head_terms` computes both over chunks of rows, keeping nothing `[U, V]` for backward,
  and recomputes each chunk's logits in backward: peak memory grows with the chunk, not
  with U x V;
- and takes each loss token's logit as one dot product of its hidden row and its target's
  weight row; its backward adds into the same weight gradient (one `[V, H]` tensor, not two
  summed).

Matrix products run in the dtype the plain head would use (autocast's on GPU, the weight's
otherwise); reductions in float32. Equal to the plain path (tests/learner/test_chunked_head.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_TEMPORARIES = 4
"""float32 `[rows, V]` tensors counted per chunk row: two alive at once (logits turned
log-probs in place, probs turned gradient in place), and room for the library's own."""


AUTO_BUDGET_MB = {"cuda": 1024.0, "cpu": 128.0}
"""`head_chunk_mb = "auto"` per device type. Each chunk reads the whole `[V, H]` weight in
forward, in the backward's recomputation and for its gradient: on a GPU that traffic and the
launches dominate small chunks (H100, bf16, 16,384 rows, V = 152,064, hidden 896: 128 MB
chunks took 402 ms against the plain head's 184, 1,024 MB 177 ms; hidden 3,584: 1,144, 296
and 233 ms; bench/head_memory.py --device cuda). On a CPU the products are compute-bound and
memory is what is short."""


def chunk_budget_mb(setting: float | str | None, device: torch.device) -> float | None:
    """The chunk budget a `head_chunk_mb` setting means on `device` (None: the plain head)."""
    if setting != "auto":
        return setting
    return AUTO_BUDGET_MB["cuda" if device.type == "cuda" else "cpu"]


def chunk_rows(vocab_size: int, budget_mb: float) -> int:
    """Rows per chunk so that a chunk's temporaries stay within `budget_mb`."""
    per_row = vocab_size * 4 * CHUNK_TEMPORARIES
    return max(1, int(budget_mb * 2**20) // per_row)


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the head's matrix product runs in: autocast's where it is on."""
    device_type = weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def _cast(weight, bias, dtype):
    """The head's weight (and bias) in `dtype`, once per pass: a copy only when the dtypes
    differ (autocast over fp32 master weights), as autocast's own cast would be."""
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _logits(hidden, weight, bias, dtype) -> torch.Tensor:
    """float32 logits of `hidden` rows under `weight`/`bias` (already in `dtype`), the
    product in `dtype` with autocast off (explicit)."""
    with torch.autocast(weight.device.type, enabled=False):
        return F.linear(hidden.to(dtype), weight, bias).float()


def _add_weight_grad(grad_weight, grad_z, chunk, dtype) -> None:
    """`grad_weight` (float32, `[V, H]`) += grad_z.T @ chunk, the product in `dtype`, with
    no `[V, H]` temporary where the library allows: cuBLAS accumulates a bf16 product into
    a float32 output in place (`out_dtype`, CUDA only); elsewhere a bf16 product is
    materialised, then added."""
    if dtype == torch.float32:
        grad_weight.addmm_(grad_z.T, chunk.float())
    elif grad_weight.is_cuda:
        torch.addmm(grad_weight, grad_z.T, chunk.to(dtype), out_dtype=torch.float32,
                    out=grad_weight)  # fmt: skip
    else:
        grad_weight += (grad_z.T @ chunk.to(dtype)).float()


class _HeadTerms(torch.autograd.Function):
    """(lse [U], entropy [U], target logits [L]) in one Function, so that backward writes
    one weight gradient: autograd would otherwise sum a second, dense one (an index's)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, token_row, targets, rows, with_entropy, dtype):
        num_rows = hidden.shape[0]
        lse = torch.empty(num_rows, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(num_rows, dtype=torch.float32, device=hidden.device)
        w, b = _cast(weight, bias, dtype)
        for start in range(0, num_rows, rows):
            log_p = _logits(hidden[start : start + rows], w, b, dtype)
            chunk_lse = torch.logsumexp(log_p, dim=-1)
            lse[start : start + rows] = chunk_lse
            if with_entropy:  # in place: two [rows, V] buffers
                log_p -= chunk_lse[:, None]
                entropy[start : start + rows] = -log_p.exp().mul_(log_p).sum(dim=-1)
        picked = (hidden[token_row].to(dtype) * w[targets]).float().sum(dim=-1)
        if bias is not None:
            picked = picked + bias[targets].float()
        ctx.save_for_backward(hidden, weight, bias, token_row, targets, lse, entropy)
        ctx.rows, ctx.with_entropy, ctx.dtype = rows, with_entropy, dtype
        return lse, entropy, picked

    @staticmethod
    def backward(ctx, grad_lse, grad_entropy, grad_picked):
        hidden, weight, bias, token_row, targets, lse, entropy = ctx.saved_tensors
        dtype, rows = ctx.dtype, ctx.rows
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_bias = None
        if bias is not None:
            grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        w, b = _cast(weight, bias, dtype)
        for start in range(0, hidden.shape[0], rows):
            stop = start + rows
            chunk = hidden[start:stop]
            log_p = _logits(chunk, w, b, dtype)
            log_p -= lse[start:stop, None]
            p = log_p.exp()
            # d lse / dz = p;  d H / dz = -p (log p + H). In place: two [rows, V] buffers.
            if ctx.with_entropy:
                grad_z = log_p.add_(entropy[start:stop, None]).mul_(p)
                grad_z.mul_(-grad_entropy[start:stop, None])
                grad_z.addcmul_(p, grad_lse[start:stop, None])
            else:
                grad_z = p.mul_(grad_lse[start:stop, None])
            grad_z = grad_z.to(dtype)
            if grad_hidden is not None:
                grad_hidden[start:stop] = (grad_z @ w).to(hidden.dtype)
            _add_weight_grad(grad_weight, grad_z, chunk, dtype)
            if grad_bias is not None:
                grad_bias += grad_z.float().sum(dim=0)
        # The target logits: z[row, target] = hidden[row] . weight[target] (+ bias[target]).
        upstream = grad_picked.float()[:, None]
        grad_weight.index_add_(0, targets, upstream * hidden[token_row].float())
        if grad_hidden is not None:
            grad_hidden.index_add_(
                0, token_row, (upstream * weight[targets].float()).to(hidden.dtype)
            )
        if grad_bias is not None:
            grad_bias = grad_bias.index_add_(0, targets, grad_picked.float()).to(bias.dtype)
        grad_weight = grad_weight.to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def head_terms(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    token_row: torch.Tensor,
    targets: torch.Tensor,
    *,
    rows: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Under the head `weight` `[V, H]` (+ `bias`), float32: per row of `hidden` `[U, H]` the
    logsumexp and the entropy (zeros unless asked), `rows` rows at a time; and the logit of
    `targets[i]` at row `token_row[i]`, `[L]`, one dot product each in the head's compute
    dtype, summed in float32 as the matrix product would. A loss token's logprob is
    `picked - lse[token_row]`."""
    return _HeadTerms.apply(
        hidden, weight, bias, token_row, targets, rows, with_entropy, compute_dtype(weight)
    )
