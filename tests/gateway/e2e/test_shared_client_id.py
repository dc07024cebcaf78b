"""Two gateways started from one config (a copied SD card): no reconnect storm, and they say so.

Both daemons are real and share the real mosquitto; only their state directories differ, so
they use the same client ids and each connection takes the other's over. Before the backoff
in ``tesla_gateway.mqtt.session_loss`` the pair reconnected about 50 times a second per connection
and logged every time. Debian's mosquitto 2.0.11 closes the old connection without a reason
code, so what the gateways can see is a run of connections closed right after being accepted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.broker import Mosquitto
from tesla_gateway.daemon.cli import main
from tests.gateway.core.test_service import NotifySocket
from tests.gateway.e2e.harness import MODEL, Daemon, wait_for, write_config
from tests.support.models import ModelFactory

WATCH_S = 4.0


def _source_session(daemon: Daemon) -> dict[str, Any]:
    session = daemon.status().get("mqtt_sessions", {}).get("mqtt-source-0", {})
    return session if isinstance(session, dict) else {}


@pytest.fixture
def notify() -> Iterator[list[NotifySocket]]:
    """systemd's notify sockets the test opens (systemd cannot run here), closed at the end."""
    sockets: list[NotifySocket] = []
    yield sockets
    for listener in sockets:
        listener.close()


def test_two_gateways_with_one_gateway_id_back_off_and_report_it(
    tmp_path: Path,
    mosquitto: Mosquitto,
    model_factory: ModelFactory,
    *,
    daemons: list[Daemon],
    notify: list[NotifySocket],
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    configs = []
    for name in ("pi-a", "pi-b"):
        (tmp_path / name).mkdir()
        configs.append(write_config(tmp_path / name, mosquitto, model.path))
        notify.append(NotifySocket(tmp_path / name / "notify.sock"))
        env = {"NOTIFY_SOCKET": str(notify[-1].path)}
        daemons.append(Daemon(configs[-1], tmp_path / name / "state", env=env))
    first, second = daemons[-2:]

    started = [_source_session(d).get("connections", 0) for d in (first, second)]
    time.sleep(WATCH_S)
    sessions = [_source_session(d) for d in (first, second)]
    made = sum(s["connections"] - c for s, c in zip(sessions, started, strict=True))
    # Backoff 0.05 s doubling to 0.5 s (the harness's config): a few per second in all; without
    # it about 200 in these 4 s.
    assert made <= 8 * WATCH_S, sessions
    assert sum(s["lost"] for s in sessions) >= 3, sessions

    flapping = wait_for(
        lambda: next(
            (d for d in (first, second) if _source_session(d).get("unstable_in_a_row", 0) >= 3),
            None,
        ),
        "a run of three short connections on one gateway",
    )
    # systemd's status line (`systemctl status`) says it too, from the daemon itself.
    which = (first, second).index(flapping)
    datagrams = notify[which].datagrams
    wait_for(
        lambda: any("mqtt mqtt-source-0: the broker closed" in d for d in datagrams),
        "the unit's status line to name the flapping connection",
    )
    capsys.readouterr()
    main(["status", "--config", str(configs[which])])
    printed = capsys.readouterr().out
    assert "mqtt mqtt-source-0: the broker closed" in printed
    assert "gateway_id" in printed

    events = [
        json.loads(line)
        for daemon in (first, second)
        for line in daemon.log.read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]
    hints = [e for e in events if e.get("event") == "mqtt_connection_unstable" and "hint" in e]
    assert hints and "tesla-gateway-" in hints[0]["hint"]
    logged = sum(1 for e in events if e.get("event", "").startswith("mqtt_connection"))
    assert logged <= 2 * WATCH_S + 10, "losses in a run are logged at most once a minute"
