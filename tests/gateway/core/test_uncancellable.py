"""A step run by run_to_completion finishes even when its caller is cancelled, then the
cancellation goes on (the tick's take and hand-off under SIGTERM: issue 26 item 13)."""

from __future__ import annotations

import asyncio

import pytest

from tesla_gateway.daemon.uncancellable import run_to_completion


class StepFailedError(RuntimeError):
    pass


async def step(done: list[str], gate: asyncio.Event, *, fail: bool = False) -> str:
    done.append("taken")
    await gate.wait()  # the calibration's await, where the shutdown used to cut the tick
    if fail:
        raise StepFailedError("midway")
    done.append("handed off")
    return "ok"


def test_a_cancelled_caller_waits_for_the_step_then_is_cancelled() -> None:
    async def scenario() -> list[str]:
        done: list[str] = []
        gate = asyncio.Event()
        caller = asyncio.create_task(run_to_completion(step(done, gate)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert done == ["taken"]
        caller.cancel()
        await asyncio.sleep(0)
        caller.cancel()  # a second cancellation (e.g. a TaskGroup aborting) waits as well
        await asyncio.sleep(0)
        assert not caller.done()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return done

    assert asyncio.run(scenario()) == ["taken", "handed off"]


def test_the_result_and_the_steps_own_error_come_through() -> None:
    async def scenario() -> None:
        open_gate = asyncio.Event()
        open_gate.set()
        assert await run_to_completion(step([], open_gate)) == "ok"
        gate = asyncio.Event()
        failing = asyncio.create_task(run_to_completion(step([], gate, fail=True)))
        await asyncio.sleep(0)
        failing.cancel()
        await asyncio.sleep(0)
        gate.set()
        with pytest.raises(StepFailedError):  # the error is not hidden by the cancellation
            await failing

    asyncio.run(scenario())
