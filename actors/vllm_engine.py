"""The rollout engine on vLLM: `generate` for the episode logic, `update_weights` for the
in-flight weight update, both on one `vllm.v1` AsyncLLM.

    actor task                        AsyncLLM (client)          engine process (worker)
    generate(prompt) ──stream──────►  request ─────────────────► step, step, ...
    update_weights(ticket):
      pause the scheduler (keep) ───► scheduler frozen, requests and KV cache kept
      collective_rpc(receive) ──────────────────────────────────► join round, receive, reload
      update_weight_version(v) ─────► later steps are labelled v
      resume_generation() ──────────► step, step, ... (same requests continue)

Each token's policy version is vLLM's own weight-version label, stamped on every step's
outputs: a trajectory that crosses an update says so token by token (actors/vllm_requests.py).
The workers' side of every update is weights/engine_side/, called by the method names and
answering in the types of weights/shared/protocol.py.

Requests that are running when an update lands keep their KV cache (unless
`recompute_kv_on_update`); requests admitted after it never reuse prefix blocks that older
weights computed: each request's prefix-cache salt changes with the weights (RL revisits the
same prompts, and vLLM cannot drop cached blocks while kept requests hold some).

On CPU the engine is configured through vLLM's environment variables (KV cache size,
OpenMP binding) and runs its one worker inside its engine-core process
(actors/engine_processes.py); on GPU the same code runs with the `vllm` wheel and NCCL.
vLLM is imported only when an engine starts, so configs stay fast to load.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from actors.config import VllmEngineConfig
from actors.engine_processes import in_core_worker_env, shut_down
from actors.types import Generation, Turn
from actors.vllm_requests import (
    TokenDelta,
    expand_spans,
    sampled_logprobs,
    sampling_params,
    to_generation,
)
from common.environ import environ_set
from weights.actor_side.follower import WeightUpdate, WeightUpdateError
from weights.shared.protocol import LoadResult, RoundTicket, StageState, Worker

log = logging.getLogger(__name__)

WORKER_EXTENSION = "weights.engine_side.vllm_worker.WeightSyncExtension"


class VllmEngine:
    """An AsyncLLM with the Engine interface (`generate`) and in-flight weight updates.
    Create with `await VllmEngine.start(config)`; call `shutdown()` when done."""

    def __init__(self, llm: Any, config: VllmEngineConfig, dtype: str = "float32") -> None:
        self.llm = llm
        self.config = config
        self.dtype = dtype
        """The resolved dtype vLLM runs in (the learner must compute in the same)."""
        self.version = config.initial_version
        self.weights_mixed = False
        """A streamed round failed half-way: generation stays paused until a whole load."""
        self._update_lock = asyncio.Lock()
        self._cache_epoch = 0  # prefix-cache salt: bumped as an update starts and ends
        self.max_lora_rank = config.max_lora_rank if config.enable_lora else None
        """The largest LoRA adapter this engine loads natively; None: it merges adapters."""
        self._lora_request = None  # the adapter version every new request generates with

    @classmethod
    async def start(cls, config: VllmEngineConfig) -> VllmEngine:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_threads_bind
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from common.cuda_driver import require_cuda
        from weights.config import WeightSyncConfig
        from weights.shared.dtypes import lora_dtype_problem, resolve_dtype
        from weights.shared.nccl_env import prepare_role

        if config.device == "cuda":  # a GPU config: no silent CPU engine
            require_cuda("actor.engine.device")
        # Before vLLM's workers start (they inherit it) and run their first collective.
        prepare_role(WeightSyncConfig().transfer_timeout_s)
        on_gpu = torch.cuda.is_available()
        dtype = resolve_dtype(config.dtype, on_gpu=on_gpu)
        if problem := lora_dtype_problem(dtype, enable_lora=config.enable_lora, on_gpu=on_gpu):
            raise ValueError(problem)
        args = AsyncEngineArgs(
            **config.vllm_engine_args(),
            dtype=dtype,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
            # One adapter slot, reloaded in place per version (weights/formats/adapter.py).
            **(
                {"enable_lora": True, "max_lora_rank": config.max_lora_rank, "max_loras": 1}
                if config.enable_lora
                else {}
            ),
        )
        worker_env = in_core_worker_env(
            config.cpu_threads_bind,
            num_workers=config.num_gpus,
            on_gpu=on_gpu,
            usable_cores=os.sched_getaffinity(0),
        )
        # No local name for the AsyncLLM: something in vLLM keeps this frame alive, and a
        # local would keep the AsyncLLM alive past shutdown() until interpreter exit.
        with environ_set(worker_env):  # the engine-core process is spawned in here
            engine = cls(AsyncLLM.from_engine_args(args), config, dtype)
        await engine.llm.update_weight_version(str(config.initial_version))
        return engine

    @property
    def num_weight_slots(self) -> int:
        """Ranks this engine takes in a weight round (one per worker)."""
        return self.config.num_gpus

    # ---- generation ---------------------------------------------------------------------------

    async def _outputs(self, prompt_token_ids: list[int], params: Any) -> AsyncIterator[Any]:
        """vLLM's outputs of one request (salted by the weights' cache epoch)."""
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        request_id = uuid.uuid4().hex
        async for output in self.llm.generate(
            {"prompt_token_ids": list(prompt_token_ids), "cache_salt": f"w{self._cache_epoch}"},
            params,
            request_id,
            lora_request=self._lora_request,
        ):
            completion = output.outputs[0]
            if completion.finish_reason not in (None, "stop", "length"):
                raise RuntimeError(f"request {request_id} ended: {completion.finish_reason}")
            yield completion

    async def stream(self, prompt_token_ids: list[int], turn: Turn) -> AsyncIterator[TokenDelta]:
        """Generate, yielding tokens as they arrive (the last delta has `finish_reason` and
        the per-token `versions`)."""
        params = sampling_params(turn, final_only=False)
        num_tokens = 0
        async for completion in self._outputs(prompt_token_ids, params):
            new_ids = list(completion.token_ids)
            num_tokens += len(new_ids)
            delta = TokenDelta(
                new_ids, sampled_logprobs(completion), self.version, time.monotonic()
            )
            if completion.finish_reason is not None:
                delta.finish_reason = completion.finish_reason
                delta.versions = expand_spans(completion.weight_versions, num_tokens)
            yield delta

    async def generate(self, prompt_token_ids: list[int], turn: Turn) -> Generation:
        """The whole turn at once: vLLM sends only the final output (per-token streaming
        costs the actor a Python round per token and engine step)."""
        params = sampling_params(turn, final_only=True)
        started_version, completion = self.version, None
        async for output in self._outputs(prompt_token_ids, params):
            completion = output  # FINAL_ONLY: one output, when the request ends
        return to_generation(completion, started_version)

    # ---- weights ------------------------------------------------------------------------------

    async def _worker_call(self, method: str, *args: Any) -> list[Any]:  # a `Worker` name
        """collective_rpc on every worker; a worker's failure becomes WeightUpdateError
        (`weights_mixed`: the worker's methods report the failures they expect, so what
        escapes them may have stopped a load part-way)."""
        try:
            return await self.llm.collective_rpc(method, args=args)
        except Exception as e:  # vLLM re-raises a worker's error as a bare Exception
            if self.llm.errored:
                raise  # the engine itself died: not a failed round
            raise WeightUpdateError(
                f"{method} failed in the engine worker: {e}", weights_mixed=True
            ) from e

    async def _pause(self, *, clear_cache: bool) -> None:
        """Freeze the scheduler, requests and their KV cache kept. Not `pause_generation`:
        it adds a fixed 20 ms sleep for output ordering only (token versions ride the
        engine core's outputs), 21.5 of the 22.9 ms an update's pause took on the demo."""
        pause = getattr(getattr(self.llm, "engine_core", None), "pause_scheduler_async", None)
        if pause is None:  # a vLLM without it
            await self.llm.pause_generation(mode="keep", clear_cache=clear_cache)
        else:
            await pause(mode="keep", clear_cache=clear_cache)

    async def update_weights(self, ticket: RoundTicket) -> WeightUpdate:
        """In-flight update from a weight round (`weights.shared.protocol.RoundTicket`): pause
        with requests kept, receive and load in the workers, relabel, resume. Staged loads
        receive first, while the engine generates (weights/engine_side/staging.py), and pause
        for the load alone. If the round fails the version stays and WeightUpdateError is raised;
        generation resumes on the old weights, or (a streamed load cut short) stays paused
        until a whole load."""
        async with self._update_lock:
            load = (Worker.RECEIVE, ticket.as_dict(), False)
            if self.config.stages_weights:
                await self._stage(ticket)
                load = (Worker.LOAD_STAGED, ticket.as_dict())
            started = time.monotonic()
            self._cache_epoch += 1  # requests admitted while the pause takes effect
            await self._pause(clear_cache=self.config.recompute_kv_on_update)
            pause_s = time.monotonic() - started
            try:
                answers = await self._worker_call(*load, self.config.track_weights_checksum)
                results = [LoadResult.from_dict(answer) for answer in answers]
                failed = [r for r in results if not r.ok]
                if failed:
                    # Some workers loaded and some did not (TP), or a load was cut short: the
                    # model no longer holds one version (nor does it if it did not before).
                    mixed = self.weights_mixed or len(failed) < len(results)
                    mixed = mixed or any(r.weights_mixed for r in results)
                    raise WeightUpdateError(
                        f"round {ticket.version} failed in the engine worker: {failed[0].error}"
                        + ("; weights mixed, generation paused" if mixed else ""),
                        weights_mixed=mixed,
                    )
                self.weights_mixed = False  # every worker loaded the whole round
                adapter_s = await self._use_adapter(results[0].adapter_path, ticket.version)
                await self.llm.update_weight_version(str(ticket.version))
                self.version = ticket.version
                self._cache_epoch += 1  # from here on: blocks of the new weights only
            except WeightUpdateError as e:
                self.weights_mixed = self.weights_mixed or e.weights_mixed
                raise
            finally:
                if not self.weights_mixed:
                    await self.llm.resume_generation()
            stall_s = time.monotonic() - started
        return WeightUpdate(
            version=ticket.version,
            stall_s=stall_s,
            pause_s=pause_s,
            receive_s=max(r.receive_s for r in results),
            load_s=max(r.load_s for r in results) + adapter_s,
            num_bytes=results[0].num_bytes,
            wire_s=max(r.wire_s for r in results),
        )

    async def _stage(self, ticket: RoundTicket) -> None:
        """Receive round `ticket` into the workers' host memory while generation goes on;
        WeightUpdateError (weights untouched, nothing paused) when the round failed."""
        swap, track = self.config.weight_swap, self.config.track_weights_checksum
        states = await self._stage_states(Worker.STAGE, ticket.as_dict(), swap, track)
        while not any(s.error for s in states) and not all(s.done for s in states):
            await asyncio.sleep(0.005)  # each call is served between two engine steps
            states = await self._stage_states(Worker.STAGED_STATE)
        if errors := [s.error for s in states if s.error]:
            await self._worker_call(Worker.DROP_STAGED)
            raise WeightUpdateError(f"round {ticket.version} failed while staged: {errors[0]}")

    async def _stage_states(self, method: str, *args: Any) -> list[StageState]:
        return [StageState.from_dict(a) for a in await self._worker_call(method, *args)]

    async def _use_adapter(self, path: str | None, version: int) -> float:
        """A LoRA adapter the workers received (or a snapshot's): load it into the engine's
        slot in place, and let every later request generate with it. Returns the seconds
        it took (0 without an adapter)."""
        if not path:
            return 0.0
        from weights.engine_side.adapter import adapter_request

        started = time.monotonic()
        try:
            await self.llm.add_lora(adapter_request(version, path, reload=True))
        except Exception as e:  # vLLM re-raises the engine core's error as a bare Exception
            if self.llm.errored:
                raise
            raise WeightUpdateError(f"LoRA adapter v{version} not loaded: {e}") from e
        self._lora_request = adapter_request(version, path, reload=False)
        return time.monotonic() - started

    async def close_weight_channel(self) -> None:
        """Leave the weight broadcast's group cleanly (not needed once the engine died)."""
        if self.llm is not None and not self.llm.errored:
            await self._worker_call(Worker.CLOSE)

    async def load_snapshot(self, path: str, version: int) -> float:
        """Load a weights snapshot from disk (a late joiner, or recovery after a failed
        round) and label later tokens `version`. Returns the stall in seconds. A snapshot
        that cannot be read (gone, truncated) raises WeightUpdateError: the version stays,
        and the weights too unless the load had begun (`weights_mixed`: stays paused)."""
        async with self._update_lock:
            started = time.monotonic()
            await self._pause(clear_cache=True)
            staged = self.config.stages_weights
            try:
                await self._load_snapshot_files(str(path), version, staged)
                await self.llm.update_weight_version(str(version))
                self.version = version
                self.weights_mixed = False
                self._cache_epoch += 1
            except WeightUpdateError as e:
                # Some files may be in, others not (streamed, cut short part-way).
                self.weights_mixed = self.weights_mixed or e.weights_mixed
                raise
            finally:
                if not self.weights_mixed:
                    await self.llm.resume_generation()
            return time.monotonic() - started

    async def _load_snapshot_files(self, path: str, version: int, staged: bool) -> None:
        """Full weights, or a LoRA adapter's directory: into the slot (vLLM's LoRA on) or
        merged into the base weights by the workers."""
        from weights.formats.adapter import is_adapter_dir

        track = self.config.track_weights_checksum
        adapter = is_adapter_dir(path)
        if adapter and self.config.enable_lora:
            await self._use_adapter(path, version)
            return
        if adapter:
            answers = await self._worker_call(Worker.MERGE_SNAPSHOT, path, version, track)
        else:
            answers = await self._worker_call(Worker.LOAD_SNAPSHOT, path, track, staged)
        results = [LoadResult.from_dict(answer) for answer in answers]
        failed = [r for r in results if not r.ok]
        if failed:
            raise WeightUpdateError(
                f"snapshot {path} not loaded: {failed[0].error}",
                weights_mixed=any(r.weights_mixed for r in results) or len(failed) < len(results),
            )
        if not adapter:
            # Full weights hold the whole policy (a LoRA run's version 0 is its base model,
            # the learner's announced rollback point): no adapter on top of them.
            self._lora_request = None

    async def weights_checksum(self) -> dict[str, float] | None:
        """Fingerprint of the weights loaded last (see `track_weights_checksum`)."""
        return (await self.llm.collective_rpc(Worker.CHECKSUM))[0]

    def shutdown(self) -> None:
        """Stop the engine processes (idempotent; engine_processes.shut_down)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            shut_down(llm)
            # AsyncLLM.__del__ shuts down again; let that happen now (it sits in reference
            # cycles), not at interpreter exit when vLLM's module globals are gone.
            del llm
            gc.collect()
