"""common/tasks.py: a task that swallows its cancellation (as Python 3.11's wait_for can)
is still stopped, and a polling loop notices a cancellation it lost."""

from __future__ import annotations

import asyncio

from common.tasks import cancel_and_wait, swallowed_cancel


async def _swallows_once(log: list[str]) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        log.append("swallowed")  # what a racing wait_for does: carry on
    await asyncio.sleep(60)


async def test_a_swallowed_cancellation_is_repeated_until_the_task_ends():
    log: list[str] = []
    task = asyncio.create_task(_swallows_once(log))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], timeout_s=5), 10)
    assert task.cancelled() and log == ["swallowed"]


async def test_a_plain_gather_would_have_waited_for_ever():
    task = asyncio.create_task(_swallows_once([]))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.3)
    assert not done  # the hang cancel_and_wait exists for
    await cancel_and_wait([task])


async def test_a_loop_sees_the_cancellation_it_lost():
    seen: list[bool] = []

    async def poller() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # lost, as above
        seen.append(swallowed_cancel())

    task = asyncio.create_task(poller())
    await asyncio.sleep(0)
    task.cancel()
    await task
    assert seen == [True]
    assert not swallowed_cancel()  # this test's own task was never cancelled
