"""A value whose ids cannot be a topic costs only itself (attacker round 2, issue 29).

Before: one reading of sensor 'room//2' (how nats-server's MQTT listener spells 'room.2') in a
tick's batch made ``Publisher.submit`` raise before queueing anything, so every other sensor's
calibrated value of that tick was lost too, tick after tick. Against a real mosquitto.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.monitor.monitor import SensorDocument
from tesla_gateway.publish.publisher import Publisher
from tests.gateway.io.helpers import collecting
from tests.gateway.io.test_publisher import config, reading

_BAD = ["room//2", "*", "caf\u00e9", "a" * 300, "s/+"]


def test_unpublishable_readings_are_skipped_and_counted_and_the_rest_delivered(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    cfg = config(mosquitto, batch_topic=True)

    async def scenario() -> dict[str, object]:
        async with Publisher(cfg, gateway_id="gw1", state_dir=tmp_path) as publisher:
            for n in range(3):
                publisher.submit(
                    [reading(n, sensor=bad) for bad in _BAD[:2]]
                    + [reading(n, sensor="ok-1")]
                    + [reading(n, sensor=bad) for bad in _BAD[2:]]
                    + [reading(n, sensor="ok-2", feature="pm2_5")]
                )
            publisher.submit([reading(3, sensor="ok-1", feature="bad/feature")])
            publisher.submit_documents(
                [SensorDocument("health", bad, "pm10", {"ok": True}) for bad in _BAD]
                + [SensorDocument("health", "ok-1", "pm10", {"ok": True})]
            )
            await asyncio.wait_for(publisher.wait_idle(), 10)
            return publisher.stats()

    with collecting(mosquitto, ["tesla/gw1/#"]) as live:
        with capture_logs() as logs:
            stats = asyncio.run(scenario())
        live.wait_for(lambda m: len(live.on("tesla/gw1/ok-1/pm10/health")) == 1)
        assert [json.loads(p)["raw"] for p in live.on("tesla/gw1/ok-1/pm10")] == [10, 11, 12]
        assert len(live.on("tesla/gw1/ok-2/pm2_5")) == 3
        batches = [json.loads(p) for p in live.on("tesla/gw1/_batch/pm10")]
        assert [[r["sensor"] for r in batch] for batch in batches] == [["ok-1"]] * 3
        topics = {m.topic for m in live.messages}
    assert not [t for t in topics if any(part in t for part in ("room", "caf", "aaaa", "+"))]
    assert stats["unpublishable"] == 3 * len(_BAD) + 1 + len(_BAD)
    logged = [log for log in logs if log["event"] == "publish_unpublishable"]
    assert {log["sensor"] for log in logged} == {bad[:80] for bad in _BAD} | {"ok-1"}
    assert all("cannot be a topic" in log["error"] for log in logged)
