"""``tesla-gateway``: run the daemon, check a configuration, show status, trigger a reload, or
write a first configuration (``init``, tesla_gateway/daemon/init_config.py).

Exit codes: 0 success; 1 runtime failure (daemon error; ``status``/``reload``: no daemon
running; ``check-config``: the daemon would start degraded, e.g. a model that would not load,
or ``--probe`` could not connect to a broker);
2 invalid configuration or usage, or a start-up check that ``run`` refuses on
(tesla_gateway/daemon/preflight.py); 3 ``status``: the daemon is not running (the LSB code).
A reader that closes the pipe early (``status | head -1``) ends the command quietly: with its
own code when all was written before (buffered), else 141, as a shell reports SIGPIPE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tesla_gateway import __version__
from tesla_gateway.contract.timefmt import iso8601
from tesla_gateway.daemon.config import GatewayConfig, load_config
from tesla_gateway.daemon.init_config import add_init_parser, run_init
from tesla_gateway.errors import ConfigError, GatewayError
from tesla_gateway.mqtt.session_loss import session_problems

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_NOT_RUNNING = 3  # status: the LSB init-script code for "program is not running"
EXIT_PIPE_CLOSED = 141  # stdout's reader left mid-output: a shell's code for death by SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a reader that leaves early (``status | head -1``) ends it quietly."""
    try:
        code = _main(argv)
    except BrokenPipeError:  # a print filled the buffer after the reader left
        _drop_stdout()
        return EXIT_PIPE_CLOSED
    except BaseException:  # argparse's SystemExit after --help, say
        _flush_quietly()
        raise
    _flush_quietly()  # here, not at exit, where a closed pipe is a traceback and code 120
    return code


def _drop_stdout() -> None:
    """Send what is still buffered for stdout nowhere: its reader has gone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _flush_quietly() -> None:
    """Flush stdout; if its reader has gone, drop what is left instead."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "init":  # writes a configuration rather than reading one
        return run_init(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"tesla-gateway: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    command: str = args.command
    if command == "run":
        return _run(config)
    if command == "check-config":
        probe_timeout_s: float | None = args.probe_timeout_s if args.probe else None
        return _check_config(
            config, check_models=not args.skip_models, probe_timeout_s=probe_timeout_s
        )
    if command == "status":
        return _status(config, as_json=args.json)
    return _reload(config)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tesla-gateway",
        description="Real-time calibration of low-cost PM sensors with the TESLA model.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "run the daemon until SIGTERM/SIGINT"),
        ("check-config", "validate the configuration (and load the models) without running"),
        ("status", "summarise state_dir/status.json of the running daemon"),
        ("reload", "ask the running daemon to reload its models (SIGHUP)"),
    ):
        command = sub.add_parser(name, help=text, description=text)
        command.add_argument("--config", type=Path, required=True, help="TOML configuration file")
        if name == "check-config":
            command.add_argument(
                "--skip-models",
                action="store_true",
                help=(
                    "do not load the models nor check that state_dir is writable (the daemon "
                    "starts degraded without them; systemd's ExecStartPre)"
                ),
            )
            command.add_argument(
                "--probe",
                action="store_true",
                help=(
                    "also connect to every configured broker once, with its credentials and "
                    "TLS, and say whether it worked (exit 1 if one did not)"
                ),
            )
            command.add_argument(
                "--probe-timeout-s",
                type=float,
                default=5.0,
                metavar="SECONDS",
                help="how long each broker gets to accept the connection (default 5)",
            )
        if name == "status":
            command.add_argument("--json", action="store_true", help="print the raw status JSON")
    add_init_parser(sub)
    return parser


def _run(config: GatewayConfig) -> int:
    from tesla_gateway.daemon.logging import configure_logging
    from tesla_gateway.daemon.loop_errors import reporting_loop_errors
    from tesla_gateway.daemon.memory import pin_mmap_threshold
    from tesla_gateway.daemon.service import GatewayService

    pin_mmap_threshold()  # before the first large array (the window snapshot) is freed
    from tesla_gateway.daemon.preflight import PreflightError, preflight, refuse_on_fatal

    try:  # the same checks as check-config (models excepted: a degraded start repairs itself)
        refuse_on_fatal(preflight(config, load_models=False))
    except PreflightError as exc:
        print(f"tesla-gateway: refusing to start: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.logging.format, config.logging.level)
    service = GatewayService(config)
    code = EXIT_FAILURE
    try:
        # Out of file descriptors: one warning a minute, not a traceback per failed accept.
        code = asyncio.run(reporting_loop_errors(service.run()))
    except* GatewayError as group:
        for error in group.exceptions:
            print(f"tesla-gateway: {error}", file=sys.stderr)
    return code


def _check_config(
    config: GatewayConfig, *, check_models: bool, probe_timeout_s: float | None
) -> int:
    """Every check ``run`` makes at start (tesla_gateway/daemon/preflight.py), the models unless
    ``--skip-models``, a connection to each broker with ``--probe``; "configuration OK" only
    when all pass."""
    from tesla_gateway.daemon.preflight import Severity, preflight, probe_brokers

    findings = preflight(config, load_models=check_models)
    print(f"gateway {config.gateway_id}, state_dir {config.state_dir}")
    print(f"  sources: {', '.join(s.kind for s in config.sources) or 'none'}")
    for finding in findings:
        if finding.passed:
            mark = "WARNING: " if finding.severity is Severity.WARNING else ""
            print(f"  {finding.check}: {mark}{finding.detail}")
        else:
            print(f"  {finding.check}: REFUSED: {finding.detail}", file=sys.stderr)
    probes = (
        [] if probe_timeout_s is None else list(probe_brokers(config, timeout_s=probe_timeout_s))
    )
    for probe in probes:  # "broker <name> <host>:<port>: ok", or the reason it failed
        print(f"  {probe.check}: {probe.detail}", file=sys.stdout if probe.passed else sys.stderr)
    severities = {finding.severity for finding in findings}
    if Severity.FATAL in severities:
        print("configuration NOT OK: the daemon would refuse to start", file=sys.stderr)
        return EXIT_CONFIG
    if Severity.DEGRADED in severities:
        print("configuration NOT OK: the daemon would start degraded", file=sys.stderr)
        return EXIT_FAILURE
    unreachable = [probe for probe in probes if not probe.passed]
    if unreachable:
        print(
            f"configuration NOT OK: {len(unreachable)} of {len(probes)} broker(s) could not be "
            "reached (the daemon would start and keep retrying)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    print("configuration OK" + (" (models not loaded: --skip-models)" if not check_models else ""))
    return EXIT_OK


def _status(config: GatewayConfig, *, as_json: bool) -> int:
    from tesla_gateway.daemon.instance_lock import read_pid_file

    path = config.status_file
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(f"no status file at {path}: has the gateway ever run here?", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    running = read_pid_file(config.pid_file)
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        print(_summary(status, running=running))
    return EXIT_OK if running else EXIT_NOT_RUNNING


def _model_lines(models: object) -> list[str]:
    """One line per model slot, with the degraded and fallback states an operator must see."""
    lines: list[str] = []
    if not isinstance(models, dict):
        return lines
    for slot, model in sorted(models.items()):
        if not isinstance(model, dict):
            continue
        feature = model.get("feature", slot)
        name = slot if feature == slot else f"{feature} ({slot})"
        channels = model.get("channels")
        line = (
            f"  model {name}: {model.get('model')} v{model.get('version')} "
            f"on {model.get('runtime')}, reloads {model.get('reloads')}, "
            f"rejected {model.get('rejected')}"
            + (
                f", channels {', '.join(map(str, channels))}"
                if isinstance(channels, list) and len(channels) > 1
                else ""
            )
        )
        if model.get("version") is None:
            line += "\n    DEGRADED: no model serves; a release or a copied model repairs it"
        if model.get("fallback"):
            line += f"\n    FALLBACK to {model.get('slot')}: {model.get('fallback')}"
        if model.get("last_error"):
            line += f"\n    last error: {model.get('last_error')}"
        lines.append(line)
    return lines


def _summary(status: dict[str, object], running: int | None) -> str:
    age = time.time() - float(str(status.get("updated_at", 0)))
    ticker = status.get("ticker") if isinstance(status.get("ticker"), dict) else {}
    assert isinstance(ticker, dict)
    rejected = status.get("rejected") if isinstance(status.get("rejected"), dict) else {}
    assert isinstance(rejected, dict)
    lines = [
        f"gateway {status.get('gateway_id')} (v{status.get('version')}): "
        + (
            f"running, pid {running}"
            if running
            else f"not running (last phase {status.get('phase')})"
        ),
        f"  updated {age:.0f} s ago, uptime {status.get('uptime_s')} s",
        f"  readings in {status.get('readings_in')}, rejected {rejected.get('total', 0)} "
        f"{rejected.get('by_reason', {})}",
        f"  published {ticker.get('published')}, calibrated {ticker.get('calibrated')}, "
        f"flagged {ticker.get('flagged')}, last inference {ticker.get('last_inference_ms')} ms",
    ]
    lines.extend(_model_lines(status.get("models")))
    windows = status.get("windows")
    if isinstance(windows, dict):
        for feature, info in sorted(windows.items()):
            if isinstance(info, dict):
                lines.append(
                    f"  windows {feature}: {info.get('sensors')} sensors, {info.get('outcomes')}"
                )
                lines.extend(_warm_up_lines(info.get("warm_up")))
    state = status.get("state")
    if isinstance(state, dict):
        set_aside = state.get("set_aside")
        count = set_aside.get("count") if isinstance(set_aside, dict) else None
        if count:
            lines.append(f"  state: {count} unreadable file(s) set aside (*.corrupt-<time>)")
        problems = state.get("problems")
        if isinstance(problems, list):
            lines.extend(f"  degraded: {problem}" for problem in problems)
    publisher = status.get("publisher")
    if isinstance(publisher, dict):
        lines.append(
            f"  publisher: connected {publisher.get('connected')}, queued "
            f"{publisher.get('queued')}, published {publisher.get('published')}, dropped "
            f"{publisher.get('dropped_total')}"
        )
    lines.extend(_session_lines(status))
    return "\n".join(lines)


def _warm_up_lines(warm_up: object) -> list[str]:
    """Sensors whose windows are not whole yet: how many, the fewest periods, when all are."""
    if not isinstance(warm_up, dict) or not warm_up.get("sensors_short"):
        return []
    ready_at = warm_up.get("all_ready_at")
    when = iso8601(float(ready_at)) if isinstance(ready_at, int | float) else "unknown"
    return [
        f"    warm-up: {warm_up['sensors_short']} sensor(s) below {warm_up.get('need')} periods "
        f"(fewest {warm_up.get('fewest_periods')}; calibrated from "
        f"{warm_up.get('calibrates_from')}), all whole by {when}"
    ]


def _session_lines(status: dict[str, object]) -> list[str]:
    """The MQTT sessions' problems (session_loss.session_problems), with the likely cause."""
    stored = status.get("mqtt_sessions")
    sessions: dict[str, object] = dict(stored) if isinstance(stored, dict) else {}
    publisher = status.get("publisher")
    if isinstance(publisher, dict):
        sessions["publisher"] = publisher.get("session")
    lines = [f"  {problem}" for problem in session_problems(sessions, time.time())]
    if lines:
        lines.append(
            f"  is a second gateway running with gateway_id {status.get('gateway_id')} (a copied "
            "SD card or config)? Give each gateway its own gateway_id."
        )
    return lines


def _reload(config: GatewayConfig) -> int:
    from tesla_gateway.daemon.instance_lock import read_pid_file

    pid = read_pid_file(config.pid_file)
    if pid is None:
        print(
            f"no running gateway found (pid file {config.pid_file}); nothing to reload",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"cannot signal pid {pid}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"reload requested from gateway pid {pid}")
    return EXIT_OK
