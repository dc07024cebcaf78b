"""The service's waiting loops end when cancelled, even as what they wait for arrives.

The shutdown feeds what the sources queued and then cancels the tick loop: when that last ingest
closes a period, the tick is asked for in the same step as the cancellation. Likewise a SIGHUP's
reload request can come with the shutdown's cancellation of the model-watch loop. On Python
3.11, ``asyncio.wait_for`` returned instead of raising when the cancellation came together with
the awaited event (CPython gh-86296): the loop went on, and the shutdown waited for it forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tesla_gateway.daemon.config import load_config
from tesla_gateway.daemon.service import GatewayService
from tesla_gateway.publish.publisher import Publisher
from tests.reliability.harness import DEFAULT_MODEL

END_BOUND_S = 5.0


def _service(tmp_path: Path) -> GatewayService:
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'gateway_id = "gw-loops"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{DEFAULT_MODEL}"\n',
        encoding="utf-8",
    )
    return GatewayService(load_config(config_file))


@pytest.mark.parametrize("loop", ["tick", "model-watch"])
def test_a_loop_cancelled_as_its_event_is_set_ends(tmp_path: Path, loop: str) -> None:
    service = _service(tmp_path)
    config = service.config
    publisher = Publisher(config.publisher, gateway_id=config.gateway_id, state_dir=tmp_path)

    async def scenario() -> None:
        # What run() sets up before it starts the loops.
        service._tick_wanted, service._reload = asyncio.Event(), asyncio.Event()
        loops: dict[str, tuple[asyncio.Event, Callable[[], Coroutine[Any, Any, None]]]] = {
            "tick": (service._tick_wanted, lambda: service._tick_loop(publisher)),
            "model-watch": (service._reload, service._watch_loop),
        }
        event, run = loops[loop]
        task = asyncio.create_task(run())
        await asyncio.sleep(0.05)  # the loop waits for its event
        event.set()  # a tick is wanted (or a reload asked for) ...
        task.cancel()  # ... and the shutdown cancels the loop in the same step
        done, _ = await asyncio.wait({task}, timeout=END_BOUND_S)
        if not done:
            task.cancel()  # once more, so that this test ends
            await asyncio.wait({task})
        assert done, f"the {loop} loop still ran {END_BOUND_S} s after its cancellation"
        assert task.cancelled()

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(publisher.aclose())
