"""A step that a cancellation lets finish: shutdown either completes it or never starts it.

A tick takes its closed periods out of the windows and hands them to the publisher, whose outbox
is durable; in between it awaits the calibration in a worker thread. Cancelled there (SIGTERM's
shutdown cancels the tick loop), the periods were in neither place and were lost. The step runs
as a task of its own: a cancellation of the caller waits for it to finish, then propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_to_completion"]

_T = TypeVar("_T")


async def run_to_completion(step: Coroutine[Any, Any, _T]) -> _T:
    """Run ``step`` to its end even if the caller is cancelled meanwhile (then re-raise the
    cancellation once the step is done). Only a cancellation of the step's own task stops it
    (``asyncio.run`` cancels what is left when the loop closes)."""
    task = asyncio.create_task(step)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))  # unlike await task, a cancellation leaves task running
        except asyncio.CancelledError as exc:
            cancelled = exc
    result = task.result()  # the step's own error wins over the cancellation
    if cancelled is not None:
        raise cancelled
    return result
