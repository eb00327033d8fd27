"""Which samples share a prefix, and which micro-batch of which rank trains them (pure).

A GRPO group repeats its prompt (system, tool schemas, user) in every sample; in multi-turn
episodes its samples may agree on more. Shared-prefix training forwards that common token
prefix once and lets every sample's suffix attend to it (`learner/trainer/segments.py` lays it out,
`learner/trainer/segment_attention.py` computes it). This module decides what is shared and where
it goes:

    samples --shared_prefix_len (per group)--> pieces --plan_pieces--> plan[rank][mb] = pieces

- A `Piece` is the unit the planner moves: either one plain sample (`prefix_len == 0`) or a
  shared prefix with the suffixes of two or more samples of one group. Its cost is its
  tokens *as trained*: the prefix once, plus every member's suffix.
- A group shares its longest common token prefix when that is at least `min_shared_tokens`
  long (otherwise its samples are plain). The prefix is capped one token short of the
  shortest member, so that every suffix has at least one token.
- A group whose piece does not fit `token_budget` is split: its members are packed
  first-fit decreasing (by suffix) into pieces of at most `token_budget` tokens, each
  carrying its own copy of the prefix. That is still exact: each member's tokens see the same
  context, and gradients of the pieces accumulate. A member whose prefix + suffix alone
  exceed the budget becomes a plain piece (its own micro-batch, as `plan_micro_batches`
  gives any over-long sequence); a piece left with one member becomes plain too.
- Pieces are spread over ranks longest first onto the least-loaded rank (balanced by tokens
  as trained), and each rank's pieces are packed first-fit decreasing into micro-batches of
  at most `token_budget` tokens. A group that fits one micro-batch therefore stays on one
  rank and in one micro-batch. Every rank gets the same number of micro-batches (trailing
  empty ones pad the short ranks: each FSDP forward is a collective all ranks must join).

Everything is a deterministic function of the samples' tokens, group ids and order, so every
rank computes the same plan from the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from learner.trainer.sample import Sample

DEFAULT_MIN_SHARED_TOKENS = 16


@dataclass(frozen=True)
class Piece:
    """A plain sample (`prefix_len == 0`, one member) or a prefix shared by >= 2 members."""

    prefix_len: int
    members: tuple[int, ...]  # indices into the batch's samples, ascending
    num_tokens: int  # as trained: prefix once + each member's suffix


def common_prefix_len(token_ids: Sequence[np.ndarray]) -> int:
    """Length of the longest token prefix all arrays agree on."""
    first = token_ids[0]
    length = len(first)
    for other in token_ids[1:]:
        n = min(length, len(other))
        differ = np.flatnonzero(first[:n] != other[:n])
        length = int(differ[0]) if len(differ) else n
    return length


def shared_prefix_len(samples: Sequence[Sample], *, min_shared_tokens: int) -> int:
    """Tokens these samples (one group) would share: their common prefix, capped one short
    of the shortest so each keeps a suffix; 0 when under `min_shared_tokens` or alone."""
    if len(samples) < 2:
        return 0
    length = min(
        common_prefix_len([s.token_ids for s in samples]), min(s.num_tokens for s in samples) - 1
    )
    return length if length >= max(min_shared_tokens, 1) else 0


def _first_fit_decreasing(items: list[int], sizes: list[int], capacity: int) -> list[list[int]]:
    """Bins of item ids, largest first into the first bin with room; an item larger than
    `capacity` gets a bin of its own. `items` must already be ordered largest first."""
    bins: list[list[int]] = []
    used: list[int] = []
    for item, size in zip(items, sizes, strict=True):
        for b, tokens in enumerate(used):
            if tokens + size <= capacity:
                bins[b].append(item)
                used[b] += size
                break
        else:
            bins.append([item])
            used.append(size)
    return bins


def _plain(index: int, samples: Sequence[Sample]) -> Piece:
    return Piece(prefix_len=0, members=(index,), num_tokens=samples[index].num_tokens)


def _group_pieces(
    members: list[int], samples: Sequence[Sample], *, token_budget: int, min_shared_tokens: int
) -> list[Piece]:
    prefix_len = shared_prefix_len(
        [samples[i] for i in members], min_shared_tokens=min_shared_tokens
    )
    if prefix_len == 0:
        return [_plain(i, samples) for i in members]
    suffix = {i: samples[i].num_tokens - prefix_len for i in members}
    if prefix_len + sum(suffix.values()) <= token_budget:
        bins = [members]
    else:
        by_suffix = sorted(members, key=lambda i: (-suffix[i], i))
        bins = _first_fit_decreasing(
            by_suffix, [suffix[i] for i in by_suffix], token_budget - prefix_len
        )
    pieces = []
    for bin_members in bins:
        if len(bin_members) == 1:
            pieces.append(_plain(bin_members[0], samples))
            continue
        ordered = tuple(sorted(bin_members))
        pieces.append(
            Piece(
                prefix_len=prefix_len,
                members=ordered,
                num_tokens=prefix_len + sum(suffix[i] for i in ordered),
            )
        )
    return pieces


def pieces_of(
    samples: Sequence[Sample], *, token_budget: int, min_shared_tokens: int
) -> list[Piece]:
    """Every sample in exactly one piece; groups in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(sample.group_id, []).append(i)
    pieces = []
    for members in groups.values():
        pieces.extend(
            _group_pieces(
                members, samples, token_budget=token_budget, min_shared_tokens=min_shared_tokens
            )
        )
    return pieces


def plan_pieces(
    samples: Sequence[Sample],
    *,
    num_ranks: int,
    token_budget: int,
    min_shared_tokens: int = DEFAULT_MIN_SHARED_TOKENS,
) -> list[list[list[Piece]]]:
    """`plan[rank][micro_batch]` = the pieces it trains; same number of micro-batches on
    every rank (trailing empty lists pad the short ones). `min_shared_tokens` larger than
    any sample turns sharing off (every piece plain)."""
    if num_ranks < 1 or token_budget < 1:
        raise ValueError(
            f"need num_ranks >= 1 and token_budget >= 1, got {num_ranks}, {token_budget}"
        )
    pieces = pieces_of(samples, token_budget=token_budget, min_shared_tokens=min_shared_tokens)
    pieces.sort(key=lambda p: (-p.num_tokens, p.members[0]))
    rank_tokens = [0] * num_ranks
    rank_pieces: list[list[int]] = [[] for _ in range(num_ranks)]
    for p, piece in enumerate(pieces):
        rank = min(range(num_ranks), key=lambda r: (rank_tokens[r], r))
        rank_tokens[rank] += piece.num_tokens
        rank_pieces[rank].append(p)
    plan = []
    for indices in rank_pieces:  # already longest first
        bins = _first_fit_decreasing(indices, [pieces[p].num_tokens for p in indices], token_budget)
        plan.append([[pieces[p] for p in b] for b in bins])
    num_micro_batches = max(len(bins) for bins in plan)
    return [bins + [[] for _ in range(num_micro_batches - len(bins))] for bins in plan]
