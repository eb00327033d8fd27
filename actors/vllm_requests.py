"""One turn as a vLLM request, and vLLM's answer as Tether's tokens: the `SamplingParams` of
a `Turn`, and from vLLM's completion output each sampled token's logprob and policy
version (from vLLM's weight-version spans), as a whole `Generation` or as the streamed
`TokenDelta`s. No engine here: `actors/vllm_engine.py` sends the requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.types import Generation, Turn


@dataclass
class TokenDelta:
    """Tokens that arrived together while streaming one request."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    """The engine's version when they arrived (the final spans are authoritative)."""
    arrived: float
    """time.monotonic() of arrival."""
    finish_reason: str | None = None
    versions: list[int] | None = None
    """On the last delta: the per-token versions of the whole request, from vLLM's spans."""


def sampling_params(turn: Turn, *, final_only: bool):
    """vLLM's SamplingParams of one turn: the sampled token's logprob only, no detokenizing,
    and either the final output alone or the tokens as they come."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        temperature=turn.sampling.temperature,
        top_p=turn.sampling.top_p,
        max_tokens=turn.max_tokens,
        seed=turn.seed,
        stop_token_ids=list(turn.stop_token_ids),
        logprobs=0,  # the sampled token's logprob only
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA,
    )


def to_generation(completion, started_version: int) -> Generation:
    """A request's final output as a Generation; `started_version` is the engine's version
    when the request was sent."""
    if completion is None or completion.finish_reason is None:
        raise RuntimeError("vLLM returned no final output")
    token_ids = list(completion.token_ids)
    versions = expand_spans(completion.weight_versions, len(token_ids))
    return Generation(
        token_ids=token_ids,
        logprobs=sampled_logprobs(completion),
        finish_reason=completion.finish_reason,
        # Without spans (never seen) every token takes the oldest version that may have
        # produced it: staleness is over-, never under-stated.
        versions=versions if versions is not None else [started_version] * len(token_ids),
    )


def sampled_logprobs(completion) -> list[float]:
    """The logprob of each sampled token (vLLM gives one {token: Logprob} per position)."""
    return [
        position[token].logprob
        for token, position in zip(completion.token_ids, completion.logprobs or [], strict=True)
    ]


def expand_spans(spans, num_tokens: int) -> list[int] | None:
    """vLLM's [start, end) version spans -> one int version per token (None if the spans
    are missing or do not cover every token)."""
    if not spans:
        return None
    versions: list[int] = []
    for span in spans:
        versions += [int(span.version)] * (span.end - span.start)
    return versions if len(versions) == num_tokens else None
