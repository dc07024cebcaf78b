"""Ending the member's tasks for sure: nats-py awaits every reply with ``asyncio.wait_for``,
which on Python 3.11 drops a cancellation that arrives in the loop pass its reply does, and the
cancelled task carries on (a heartbeat loop then beat forever and SIGTERM never ended the
daemon). So the member's loops call :func:`checkpoint`, and :func:`cancel` cancels again until
the task ends, for a bounded time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from tesla_gateway.cluster.engine import transient

__all__ = ["cancel", "checkpoint", "give_up_after"]

_log = structlog.get_logger(__name__)
_CANCEL_WAIT_S = 5.0  # a cancelled task ends by then, else it is left behind (logged)
_RECANCEL_S = 1.0  # a cancellation repeated while the task runs (its clean-up gets a second)


async def cancel(task: asyncio.Task[None] | None, *, wait_s: float = _CANCEL_WAIT_S) -> bool:
    """Cancel ``task`` and wait up to ``wait_s`` for it to end, cancelling it again meanwhile
    (a cancellation nats-py dropped); True once it ended. The caller's own cancellation is
    never swallowed here (the old ``suppress(CancelledError)`` around ``await task`` took it
    for the task's, so a leave's time limit passed unnoticed)."""
    if task is None or task is asyncio.current_task():
        return task is None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            _log.warning("cluster_task_left_running", task=task.get_name(), waited_s=wait_s)
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(_RECANCEL_S, remaining))
    return True


def checkpoint() -> None:
    """Raise the cancellation this task was asked for if an await swallowed it (nats-py's
    ``wait_for`` on Python 3.11), so a loop ends at its next step instead of never."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def give_up_after(step: Coroutine[Any, Any, None], wait_s: float, what: str) -> None:
    """Run ``step`` for at most ``wait_s``, then cancel it and go on (logged ``<what>_abandoned``):
    closing a connection to a server that stopped answering (nats-py's drain swallows a
    cancellation and then flushes for 10 s). Its nats errors are logged, not raised."""
    task = asyncio.create_task(step, name=what)
    done, _ = await asyncio.wait({task}, timeout=wait_s)
    if not done:
        _log.warning(f"{what}_abandoned", waited_s=wait_s)
        await cancel(task, wait_s=wait_s)
        return
    error = task.exception()
    if isinstance(error, transient()):
        _log.warning(f"{what}_failed", error=str(error) or type(error).__name__)
    elif error is not None:
        raise error
