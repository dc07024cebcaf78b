"""``python -m devkit.demo`` (``make demo``): see devkit/demo/__init__.py."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from devkit.broker import MOSQUITTO
from devkit.demo.replay_slice import default_slice_path
from devkit.demo.session import DemoOptions, run_demo
from devkit.errors import DevkitError

_ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.demo",
        description=(
            "Run the real gateway daemon on a replayed day of real co-location data: simulated "
            "nodes over MQTT and a pty serial line, a live view, a summary and a plot."
        ),
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="how long the replay runs, wall-clock seconds (default 60; start-up adds ~5 s)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=None,
        help="replay speed-up, history seconds per second (default: fit the slice in --seconds)",
    )
    parser.add_argument("--data", type=Path, default=default_slice_path(), help="slice CSV")
    parser.add_argument(
        "--model",
        type=Path,
        default=_ROOT / "models" / "pm10-ispra-1min",
        help="model directory (default: the committed models/pm10-ispra-1min)",
    )
    covariate = parser.add_mutually_exclusive_group()
    covariate.add_argument(
        "--covariate-model",
        type=Path,
        default=_ROOT / "models" / "pm10-ispra-1min-rh-temp",
        help="served beside --model to the nodes that report rh and temp_c (default: the "
        "committed models/pm10-ispra-1min-rh-temp)",
    )
    covariate.add_argument(
        "--no-covariate-model",
        dest="covariate_model",
        action="store_const",
        const=None,
        help="serve --model alone",
    )
    parser.add_argument(
        "--out", type=Path, default=_ROOT / "demo-output", help="where the plot and CSV go"
    )
    parser.add_argument(
        "--mosquitto", type=Path, default=MOSQUITTO, help=f"broker binary (default {MOSQUITTO})"
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--live", dest="tty", action="store_true", default=None, help="redraw")
    view.add_argument("--plain", dest="tty", action="store_false", help="periodic plain lines")
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the Ctrl-C path: everything started is stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.seconds <= 0 or (args.speed is not None and args.speed <= 0):
        print("demo: --seconds and --speed must be positive", file=sys.stderr)
        return 2
    options = DemoOptions(
        data=args.data,
        model_dir=args.model,
        out_dir=args.out,
        seconds=args.seconds,
        speed=args.speed,
        tty=sys.stdout.isatty() if args.tty is None else args.tty,
        mosquitto=args.mosquitto,
        covariate_model_dir=args.covariate_model,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = run_demo(options)
    except DevkitError as exc:  # DemoError and the broker's, daemon's and pty's errors
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "\ndemo interrupted; the broker, the daemon and the nodes are stopped", file=sys.stderr
        )
        return 130
    print(outcome.summary)
    print(
        "\nErrors are in µg/m³ against the station reference, raw and calibrated over the same "
        "periods.\nThe test box was never seen in training; a training box's figure is optimistic."
    )
    print(f"traces: {outcome.traces}")
    if outcome.plot is None:
        print("plot skipped: matplotlib is not installed (it is in the train extra; `make setup`)")
    else:
        print(f"plot:   {outcome.plot}")
    calibrated = sum(score.calibrated for score in outcome.scoreboard.sensors.values())
    if calibrated == 0:
        print(
            "demo failed: the gateway calibrated nothing (see demo-output/gateway.log)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
