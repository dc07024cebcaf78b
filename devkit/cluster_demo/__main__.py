"""``python -m devkit.cluster_demo`` (``make cluster-demo``): see devkit/cluster_demo/session.py."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from devkit.cluster_demo.session import ClusterDemoOptions, run_cluster_demo
from devkit.demo.replay_slice import default_slice_path
from devkit.errors import DevkitError
from tesla_gateway.errors import GatewayError

_ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.cluster_demo",
        description=(
            "Three nats-servers and three gateways in cluster mode on loopback calibrate the "
            "replayed demo slice; one gateway is SIGKILLed mid-run; a verdict counts gaps and "
            "duplicates in every sensor's calibrated series (exit 1 if any)."
        ),
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="replay length (default 60)")
    parser.add_argument("--hours", type=float, default=None, help="replay the first hours only")
    parser.add_argument(
        "--kill-at", type=float, default=0.5, help="when to kill, fraction of the replay"
    )
    parser.add_argument("--partitions", type=int, default=6, help="partitions (default 6)")
    parser.add_argument("--keep", type=Path, help="keep the servers' and gateways' logs here")
    parser.add_argument("--data", type=Path, default=default_slice_path(), help="slice CSV")
    parser.add_argument(
        "--model",
        type=Path,
        action="append",
        help="model directory, repeatable (default: the committed pm10-ispra-1min and its "
        "rh-temp sibling)",
    )
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the Ctrl-C path: everything started is stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.seconds <= 0 or not 0 < args.kill_at < 1:
        print("--seconds must be > 0 and --kill-at within (0, 1)", file=sys.stderr)
        return 2
    models = args.model or [
        _ROOT / "models" / "pm10-ispra-1min",
        _ROOT / "models" / "pm10-ispra-1min-rh-temp",
    ]
    options = ClusterDemoOptions(
        data=args.data,
        model_dirs=tuple(models),
        seconds=args.seconds,
        hours=args.hours,
        kill_at=args.kill_at,
        partitions=args.partitions,
        keep=args.keep,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = run_cluster_demo(options, sys.stdout)
    except (DevkitError, GatewayError) as exc:
        print(f"cluster demo failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    return 0 if outcome.clean else 1


if __name__ == "__main__":
    sys.exit(main())
