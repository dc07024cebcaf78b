"""The end-to-end benchmark's subscriber: receives calibrated messages and stamps their arrival.

Its own process (``python -m devkit.bench.e2e_subscriber --port P --out FILE``), subscribed
with QoS 0 to ``tesla/+/+/+``. It prints ``ready`` once subscribed, records every non-retained
message with ``time.monotonic()`` of the read that brought it (system-wide on Linux, so
comparable with the generator's publication stamps), and on SIGTERM writes what it received to
``--out``: per calibrated reading (one per message on ``<prefix>/<sensor>/<feature>``, an array on
``<prefix>/_batch/<feature>``) the arrival, the sensor number, the closed period's index and
whether it carried a calibration.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from datetime import datetime
from pathlib import Path
from types import FrameType

from devkit.bench.mqtt_wire import Inbound, WireSubscriber

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.bench.e2e_subscriber", description=__doc__
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    stop = False

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    subscriber = WireSubscriber("127.0.0.1", args.port, "bench-subscriber", "tesla/+/+/+")
    subscriber.wait_subscribed()
    print("ready", flush=True)
    received: list[Inbound] = []
    while not stop:
        received.extend(m for m in subscriber.read(timeout_s=0.1) if not m.retained)
    subscriber.close()
    rows: list[tuple[float, int, int, bool]] = []
    for message in received:
        parts = message.topic.split("/")
        if len(parts) != 4 or parts[3] == "availability":
            continue  # status, stats, a sensor's online/offline
        if parts[2] == "_batch":
            documents = json.loads(message.payload)
        elif parts[2].startswith("node-"):
            documents = [{"sensor": parts[2], **json.loads(message.payload)}]
        else:
            continue
        for document in documents:
            start = datetime.fromisoformat(document["period_start"]).timestamp()
            period = round(start) // int(document["period_s"])
            sensor = int(document["sensor"][5:])
            rows.append((message.arrival, sensor, period, document["calibrated"] is not None))
    args.out.write_text(json.dumps(rows), encoding="utf-8")
    sys.exit(0)


if __name__ == "__main__":
    main()
