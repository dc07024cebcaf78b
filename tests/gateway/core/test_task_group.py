"""run_task_group: a component's tasks live and die together, and the error is the task's own."""

from __future__ import annotations

import asyncio

import pytest

from tesla_gateway.task_group import run_task_group


def test_a_failing_task_cancels_its_siblings_and_its_own_error_is_raised() -> None:
    sibling_cancelled = asyncio.Event()

    async def sibling() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise

    async def failing() -> None:
        await asyncio.sleep(0)
        raise KeyError("broken")

    async def scenario() -> None:
        with pytest.raises(KeyError, match="broken"):
            await run_task_group({"sibling": sibling(), "failing": failing()})
        assert sibling_cancelled.is_set()

    asyncio.run(scenario())


def test_cancelling_the_group_cancels_every_task() -> None:
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def scenario() -> None:
        group = asyncio.create_task(run_task_group({n: forever(n) for n in ("a", "b")}))
        await asyncio.sleep(0.01)
        group.cancel()
        with pytest.raises(asyncio.CancelledError):
            await group
        assert sorted(cancelled) == ["a", "b"]

    asyncio.run(scenario())
