"""A component's long-running tasks run as one asyncio.TaskGroup, their first error raised as is."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

__all__ = ["run_task_group"]


async def run_task_group(tasks: Mapping[str, Coroutine[Any, Any, None]]) -> None:
    """Run the named coroutines in one TaskGroup until all end, one fails or this is cancelled.

    A failure cancels the others and is raised itself, not as an ExceptionGroup of one, so that
    the owner's ``except`` clauses see the error the task raised.
    """
    try:
        async with asyncio.TaskGroup() as group:
            for name, coroutine in tasks.items():
                group.create_task(coroutine, name=name)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
