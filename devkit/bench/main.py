"""The benchmark driver: model cost, inference throughput, end to end, footprint, training speed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from devkit.bench.cluster import report as cluster_report
from devkit.bench.inference import device_graph_rate, measure_inference, realistic_windows
from devkit.bench.yardstick import gemm_flops_per_second
from tesla_gateway.contract.manifest import Manifest, load_manifest
from training.bench.flops import count_flops, flops_by_op, resolve_graph
from training.flatbuffer import read_graph

__all__ = ["main"]

DEFAULT_MODEL = Path("models/pm10-ispra-1min")
RESULTS = Path(__file__).with_name("results.json")


def _child(module: str, *args: str) -> dict[str, float]:
    completed = subprocess.run(  # noqa: S603 - our own modules, no shell
        [sys.executable, "-m", module, *args],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return figures


def _row(label: str, value: str) -> None:
    print(f"  {label:<52} {value}")


def _print_end_to_end(e2e: dict[str, float], counts: tuple[int, ...]) -> None:
    _row("daemon start-up to status.json 'running'", f"{e2e['startup_s']:.2f} s")
    _row("daemon resident memory at start (VmRSS)", f"{e2e['daemon_rss_mb_start']:.1f} MiB")
    for s in counts:
        restore = e2e[f"startup_restore_s_{s}"]
        print(f"  -- {s:,} sensors (windows full, restored at start in {restore:.2f} s)")
        _row(
            "sustained readings/s, 1 reading per message",
            f"{e2e[f'e2e_readings_per_s_{s}']:>10,.0f} /s  "
            f"({e2e[f'e2e_cpu_us_per_reading_{s}']:.1f} us CPU per reading)",
        )
        _row(
            "sustained readings/s, 10 readings per message",
            f"{e2e[f'e2e_batched_readings_per_s_{s}']:>10,.0f} /s  "
            f"({e2e[f'e2e_batched_cpu_us_per_reading_{s}']:.1f} us CPU per reading)",
        )
        if f"e2e_paced_kept_up_{s}" in e2e:
            kept = "kept up" if e2e[f"e2e_paced_kept_up_{s}"] else "fell behind"
            _row(
                "open loop at 90 % of that rate",
                f"{e2e[f'e2e_paced_offered_per_s_{s}']:>10,.0f} /s  {kept} "
                f"(max backlog {e2e[f'e2e_paced_max_backlog_{s}']:,.0f})",
            )
        _row(
            f"latency at {s:,} x 1 reading/s: p50 / p99 / max",
            f"{e2e[f'e2e_latency_p50_ms_{s}']:,.1f} / {e2e[f'e2e_latency_p99_ms_{s}']:,.1f} / "
            f"{e2e[f'e2e_latency_max_ms_{s}']:,.1f} ms  "
            f"({e2e[f'e2e_latency_samples_{s}']:,.0f} messages, "
            f"{e2e[f'e2e_latency_missing_{s}']:,.0f} missing)",
        )
        if f"e2e_latency_p99_ms_batch_topic_{s}" in e2e:
            _row(
                "  same, published on <prefix>/_batch/<feature>",
                f"{e2e[f'e2e_latency_p50_ms_batch_topic_{s}']:,.1f} / "
                f"{e2e[f'e2e_latency_p99_ms_batch_topic_{s}']:,.1f} / "
                f"{e2e[f'e2e_latency_max_ms_batch_topic_{s}']:,.1f} ms",
            )
        _row(
            "daemon VmRSS / VmHWM with the windows full",
            f"{e2e[f'daemon_rss_mb_{s}']:.1f} / {e2e[f'daemon_peak_rss_mb_{s}']:.1f} MiB  "
            f"({e2e[f'daemon_rss_mb_after_load_{s}']:.1f} after the load phases)",
        )
        _row(
            "daemon CPU per 1,000 calibrations (incl. ingest)",
            f"{e2e[f'cpu_s_per_1000_calibrations_{s}']:.3f} s  "
            f"({100 * e2e[f'daemon_cpu_fraction_realtime_{s}']:.0f} % of a core at 1 reading/s)",
        )
    _row(
        "load average (1 min) before / after",
        f"{e2e['load_average_1min_before']:.2f} / {e2e['load_average_1min_after']:.2f}",
    )


def _model_cost_and_inference(
    model_dir: Path, manifest: Manifest, counts: tuple[int, ...]
) -> dict[str, float | int | str]:
    """Sections 1 and 2: FLOPs, the GEMM yardstick, batched vs per-sensor throughput."""
    results: dict[str, float | int | str] = {}
    print("1. Model cost")
    # Shapes resolved by one batch-1 invoke: the float graph's stored shapes are placeholders
    # behind its dynamic batch (training/bench/flops.py explains the method).
    window = realistic_windows(1, manifest.window_length)[0]
    graph = resolve_graph((model_dir / manifest.files["float32"].path).read_bytes(), window)
    flops = count_flops(graph)
    device_flops = count_flops(read_graph((model_dir / manifest.files["int8"].path).read_bytes()))
    gemm_before = gemm_flops_per_second()
    results.update(
        flops_per_calibration=flops,
        device_graph_ops_per_calibration=device_flops,
        gemm_flops_per_s_before=gemm_before,
    )
    _row("FLOPs per calibration (float graph)", f"{flops:,}")
    for op, count in sorted(flops_by_op(graph).items(), key=lambda item: -item[1]):
        if count:
            _row(f"  {op}", f"{count:,}")
    _row("single-thread float32 GEMM (NumPy, n=512)", f"{gemm_before / 1e9:.2f} GFLOP/s")

    print("2. Inference through the gateway's Calibrator (LiteRT, 1 thread)")
    measured = measure_inference(model_dir, counts)
    # The yardstick again after the inference runs; the higher of the two sets the limit, so
    # a slow moment of the machine cannot flatter the fraction.
    gemm_after = gemm_flops_per_second()
    gemm = max(gemm_before, gemm_after)
    limit = gemm / flops
    results.update(gemm_flops_per_s_after=gemm_after, gemm_flops_per_s=gemm,
                   physical_limit_per_s=limit)  # fmt: skip
    _row("GEMM again after the runs; the higher one is used", f"{gemm_after / 1e9:.2f} GFLOP/s")
    _row("physical limit = GEMM / FLOPs", f"{limit:,.0f} calibrations/s")
    for result in measured:
        s = result.sensors
        results[f"batched_per_s_{s}"] = result.batched_per_s
        results[f"per_sensor_per_s_{s}"] = result.per_sensor_per_s
        results[f"batched_speedup_{s}"] = result.speedup
        results[f"fraction_of_limit_{s}"] = result.batched_per_s / limit
        _row(
            f"{s:>6} sensors: batched / one invoke each",
            f"{result.batched_per_s:>10,.0f} /s  {result.per_sensor_per_s:>9,.0f} /s  "
            f"x{result.speedup:5.2f}  {100 * result.batched_per_s / limit:5.1f} % of limit",
        )
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, no training run")
    parser.add_argument(
        "--inference-only", action="store_true", help="sections 1 and 2 only (about 20 s)"
    )
    args = parser.parse_args(argv)
    manifest = load_manifest(args.model)
    results: dict[str, float | int | str] = {"model": manifest.name, "version": manifest.version}

    print(f"tesla-gateway benchmark — {manifest.name} v{manifest.version}, one core")
    counts = (1, 64, 1000) if args.quick else (1, 64, 1000, 10000)
    e2e_counts = (1000, 10000)
    results.update(_model_cost_and_inference(args.model, manifest, counts))
    device = device_graph_rate(args.model)
    results["device_graph_per_s"] = device
    _row("integer device graph (batch 1) under LiteRT", f"{device:,.0f} /s")

    if args.inference_only:
        return _write(results, args.out)

    print(
        "3. End to end (mosquitto on loopback -> daemon -> subscriber; devkit/bench/end_to_end.py)"
    )
    e2e = _child(
        "devkit.bench.end_to_end", str(args.model), "--sensors", *(str(c) for c in e2e_counts)
    )
    results.update(e2e)
    _print_end_to_end(e2e, e2e_counts)
    limit = _child("devkit.bench.broker_limit", "--sensors", str(max(e2e_counts)))
    results.update(limit)
    for s in e2e_counts:
        results[f"fraction_of_broker_{s}"] = (
            e2e[f"e2e_readings_per_s_{s}"] / limit["broker_forward_per_s"]
        )
    _row(
        "broker limit: C publisher -> broker -> C subscriber",
        f"{limit['broker_forward_per_s']:>10,.0f} /s  (devkit/bench/broker_limit.py)",
    )
    _row(
        "  same loop, the bench's load generator publishing",
        f"{limit['broker_forward_loadgen_per_s']:>10,.0f} /s",
    )
    _row(
        f"daemon at {max(e2e_counts):,} sensors, 1 per message / broker limit",
        f"{100 * results[f'fraction_of_broker_{max(e2e_counts)}']:.0f} %",
    )

    print("4. Footprint (a process holding the daemon's model and windows)")
    footprint = _child(
        "devkit.bench.footprint", str(args.model), *(str(c) for c in counts if c >= 1000)
    )
    for key, value in footprint.items():
        results[f"footprint_{key}"] = value
        shown = f"{value / 2**20:.1f} MiB" if key.startswith("rss") else f"{value:,.2f}"
        _row(key, shown)

    print("5. Cluster mode (NATS JetStream, issue 29; devkit/bench/cluster.py)")
    cluster = _child("devkit.bench.cluster", "--model", str(args.model))
    results.update(cluster)
    cluster_report(cluster, _row)

    if not args.quick:
        print("6. Training (TESLA, synthetic 6 sensors x 10 days, batch 32)")
        training = _child("devkit.bench.training_speed")
        for key, value in training.items():
            results[f"training_{key}"] = value
            _row(key, f"{value:,.1f}")

    return _write(results, args.out)


def _write(results: dict[str, float | int | str], out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0
