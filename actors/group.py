"""A GRPO group: the n samples of one prompt task played concurrently on one engine (they
share the prompt's prefix cache), each an episode of actors/episode.py. A redelivered
task's samples continue from their last recorded turn (actors/resume.py) or are skipped
when stored. A replica that leaves stops each sample at its next turn boundary (`Leaving`)
and hands the group back: another replica continues it from there."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

from actors.episode import Episode, Rollout, run_episode, validate_task
from actors.types import EpisodeResult
from broker.wire import EpisodeCheckpoint, PromptTask

log = logging.getLogger(__name__)


class Leaving(Exception):  # noqa: N818 (what happens, not an error)
    """Raised by an `on_turn` callback when the replica is leaving: the sample stops at this
    turn boundary, its checkpoint recorded, for another replica to continue. The group goes
    on until each of its samples has finished or stopped so, then raises it."""


async def run_group(
    rollout: Rollout,
    task: PromptTask,
    *,
    on_result: Callable[[int, EpisodeResult], Awaitable[None]] | None = None,
    saved: Mapping[int, EpisodeCheckpoint] | None = None,
    on_turn: Callable[[int, Episode], Awaitable[None]] | None = None,
) -> list[EpisodeResult]:
    """Play the task's group_size samples concurrently; results in sample order. A seeded
    `sampling` gives sample i the seed `seed + i`. `on_result(i, result)` is awaited as each
    sample finishes (to publish it at once), `on_turn(i, episode)` after each turn that does
    not end it. `saved`: the checkpoints of a redelivered task, by sample; a sample marked
    stored is not played (nor in the results), one with tokens continues from its last turn
    when it can. If one sample raises (TaskRejected, an engine failure), the others are
    cancelled and that exception is raised; `Leaving` stops only the sample that raised it,
    and is raised once every sample has ended (those that finished were passed to
    `on_result`)."""
    validate_task(task)
    saved = saved or {}
    base_seed = rollout.sampling.seed

    async def sample(index: int) -> EpisodeResult | None:
        seed = None if base_seed is None else base_seed + index
        turned = None if on_turn is None else functools.partial(on_turn, index)
        try:
            result = await run_episode(
                rollout, task, seed=seed, saved=saved.get(index), on_turn=turned
            )
        except Leaving:
            return None  # stopped at a turn boundary: another replica continues it
        if on_result is not None:
            await on_result(index, result)
        return result

    to_play = [i for i in range(task.group_size) if not (i in saved and saved[i].stored)]
    try:
        async with asyncio.TaskGroup() as group:
            episodes = {i: group.create_task(sample(i)) for i in to_play}
    except ExceptionGroup as failures:
        # All samples share one prompt: the first cause speaks for the group.
        raise failures.exceptions[0] from None
    results = {i: e.result() for i, e in episodes.items()}
    left = [i for i, result in results.items() if result is None]
    if left:
        raise Leaving(f"task {task.task_id}: samples {left} stopped at a turn boundary")
    failed = failed_samples_line(task.task_id, results)
    if failed is not None:
        log.warning(failed)
    return list(results.values())


def failed_samples_line(
    task_id: str, results: list[EpisodeResult] | Mapping[int, EpisodeResult]
) -> str | None:
    """One line for the samples of a group that an env failure ended (`error:*`): how many,
    under which stop reasons, and the error of the first of them; None when none did.
    `results`: every sample's, or those played by sample index."""
    if not isinstance(results, Mapping):
        results = dict(enumerate(results))
    failed = [(i, r) for i, r in results.items() if r.stop_reason.startswith("error:")]
    if not failed:
        return None
    reasons = Counter(r.stop_reason for _, r in failed)
    by_reason = ", ".join(f"{reason} x{n}" for reason, n in sorted(reasons.items()))
    first_index, first = failed[0]
    return (
        f"task {task_id}: {len(failed)} of {len(results)} samples ended with an env error "
        f"({by_reason}); sample {first_index}: {first.error}"
    )
