"""The gateways of a cluster run as real daemon processes, and what their status.json says about
the cluster: the partitions each owns and has replayed, and how many readings it has decoded."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devkit.cluster_demo.config import ClusterGatewayConfig, write_cluster_config
from devkit.daemon import GatewayDaemon
from devkit.errors import DevkitError

__all__ = ["ClusterGroup", "Member", "balanced_placement", "member_configs"]

_READY_S = 90.0
_POLL_S = 0.1


class Member:
    """One gateway daemon in cluster mode; ``killed`` once SIGKILLed."""

    def __init__(self, config: ClusterGatewayConfig, *, cpu: int | None = None) -> None:
        self.name = config.gateway_id
        path = write_cluster_config(config)
        self.daemon = GatewayDaemon(
            path, config.state_dir, log=config.work_dir / "daemon.log", new_session=True, cpu=cpu
        )
        self.killed = False

    def cluster(self) -> dict[str, Any]:
        """The ``cluster`` part of its status.json ({} before it writes one, or once dead)."""
        if self.killed or not self.daemon.running:
            return {}
        try:
            document = self.daemon.status().get("cluster")
        except DevkitError:
            return {}
        return document if isinstance(document, dict) else {}

    def partitions(self) -> list[int]:
        owned = self.cluster().get("partitions") or {}
        return sorted(int(p) for p, info in owned.items() if info.get("ready"))

    def decoded(self) -> int:
        return int(self.cluster().get("decoded") or 0)

    def kill(self) -> None:
        self.daemon.kill()
        self.killed = True


class ClusterGroup:
    """``members`` started together; ``with`` stops every live one cleanly (exit codes kept)."""

    def __init__(self, members: Sequence[Member], partitions: int) -> None:
        self.members = list(members)
        self.partitions = partitions
        self.exit_codes: dict[str, int | None] = {}

    def __enter__(self) -> ClusterGroup:
        try:
            for member in self.members:
                member.daemon.start()
            for member in self.members:
                member.daemon.wait_ready(_READY_S, wait_sources=False)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for member in self.members:
            with contextlib.suppress(DevkitError):
                code = member.daemon.stop()
                if not member.killed:
                    self.exit_codes[member.name] = code

    @property
    def live(self) -> list[Member]:
        return [m for m in self.members if not m.killed]

    def placement(self) -> dict[str, list[int]]:
        return {m.name: m.partitions() for m in self.live}

    def balanced(self) -> bool:
        return balanced_placement(self.placement(), self.partitions)

    def wait_balanced(self, timeout_s: float = _READY_S) -> float:
        """Seconds until :meth:`balanced`; raises with the placement seen if it never is."""
        started = time.monotonic()
        while not self.balanced():
            for member in self.live:
                member.daemon.check_alive()
            if time.monotonic() - started > timeout_s:
                raise DevkitError(
                    f"the gateways did not share the {self.partitions} partitions within "
                    f"{timeout_s:.0f} s: {self.placement()}"
                )
            time.sleep(_POLL_S)
        return time.monotonic() - started


def balanced_placement(owned: Mapping[str, Sequence[int]], partitions: int) -> bool:
    """Every partition owned (and replayed) by exactly one live gateway, none over ceil(P/G):
    ``owned`` maps each live gateway to the partitions it reports."""
    every = sorted(p for ps in owned.values() for p in ps)
    share = math.ceil(partitions / max(len(owned), 1))
    return every == list(range(partitions)) and all(len(ps) <= share for ps in owned.values())


def member_configs(
    work_dir: Path,
    count: int,
    model_dirs: Sequence[Path],
    urls: Sequence[str],
    mqtt_ports: Sequence[int],
    **settings: Any,
) -> list[ClusterGatewayConfig]:
    """``g1``..``gN``, each listing every server (its own node first) and publishing MQTT to a
    different node."""
    configs = []
    for index in range(count):
        first = index % len(urls)
        configs.append(
            ClusterGatewayConfig(
                work_dir=work_dir / f"g{index + 1}",
                gateway_id=f"g{index + 1}",
                model_dirs=model_dirs,
                servers=[*urls[first:], *urls[:first]],
                mqtt_port=mqtt_ports[first],
                **settings,
            )
        )
    return configs
