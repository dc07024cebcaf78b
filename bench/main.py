"""The benchmark driver: model cost, inference throughput, footprint, training speed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.flops import count_flops, flops_by_op
from bench.inference import device_graph_rate, measure_inference
from bench.yardstick import gemm_flops_per_second
from gateway.manifest import load_manifest
from training.flatbuffer import read_graph

__all__ = ["main"]

DEFAULT_MODEL = Path("models/pm10-ispra-1min")
RESULTS = Path("bench/results.json")


def _child(module: str, *args: str) -> dict[str, float]:
    completed = subprocess.run(  # noqa: S603 - our own modules, no shell
        [sys.executable, "-m", module, *args],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _row(label: str, value: str) -> None:
    print(f"  {label:<52} {value}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, no training run")
    args = parser.parse_args(argv)
    manifest = load_manifest(args.model)
    results: dict[str, float | int | str] = {"model": manifest.name, "version": manifest.version}

    print(f"tesla-gateway benchmark — {manifest.name} v{manifest.version}, one core")
    print("1. Model cost")
    graph = read_graph((args.model / manifest.files["float32"].path).read_bytes())
    flops = count_flops(graph)
    device_flops = count_flops(read_graph((args.model / manifest.files["int8"].path).read_bytes()))
    gemm = gemm_flops_per_second()
    limit = gemm / flops
    results.update(
        flops_per_calibration=flops,
        device_graph_ops_per_calibration=device_flops,
        gemm_flops_per_s=gemm,
        physical_limit_per_s=limit,
    )
    _row("FLOPs per calibration (float graph)", f"{flops:,}")
    _row("  of which FULLY_CONNECTED", f"{flops_by_op(graph).get('FULLY_CONNECTED', 0):,}")
    _row("single-thread float32 GEMM (NumPy, n=512)", f"{gemm / 1e9:.2f} GFLOP/s")
    _row("physical limit = GEMM / FLOPs", f"{limit:,.0f} calibrations/s")

    print("2. Inference through the gateway's Calibrator (LiteRT, 1 thread)")
    counts = (1, 64, 1000) if args.quick else (1, 64, 1000, 10000)
    for result in measure_inference(args.model, counts):
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
    device = device_graph_rate(args.model)
    results["device_graph_per_s"] = device
    _row("integer device graph (batch 1) under LiteRT", f"{device:,.0f} /s")

    print("3. Footprint (a process holding the daemon's model and windows)")
    footprint = _child("bench.footprint", str(args.model), *(str(c) for c in counts if c >= 1000))
    for key, value in footprint.items():
        results[f"footprint_{key}"] = value
        shown = f"{value / 2**20:.1f} MiB" if key.startswith("rss") else f"{value:,.2f}"
        _row(key, shown)

    if not args.quick:
        print("4. Training (TESLA, synthetic 6 sensors x 10 days, batch 32)")
        training = _child("bench.training_speed")
        for key, value in training.items():
            results[f"training_{key}"] = value
            _row(key, f"{value:,.1f}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0
