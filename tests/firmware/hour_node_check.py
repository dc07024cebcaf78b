"""A model that reads the hour of the day, on the emulated node: the node is told the time by a
``T`` line (with ``#U``: as received at uptime 0, so period ``p`` starts at ``t0 + p * period``),
its PM readings go into its own window period by period, and at a few histories its quantised
input sums to that of the input the contract's rule gives (tests/firmware/hour_vectors.py: the
hour of each period's start in the standard offset, young windows padded after) and its output
is LiteRT's on that input. Before any ``T`` line the hour channels are UNKNOWN_HOUR.

No committed default reads the hour, so this is a check to run by hand on a model directory
that does (it needs qemu and the ARM toolchain): ``python -m tests.firmware.hour_node_check
MODEL_DIR``. The pieces it rests on are tested in ``make test``: the host tests replay the hour
vectors against the contract, and the emulated node's ``T`` line is tested in
test_firmware_m4.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.contract.series import pad_history
from tesla_gateway.contract.time_of_day import UNKNOWN_HOUR, hour_phase, is_hour_channel
from tests.firmware.qemu_node import build, emulated_node, missing_prerequisite

ROOT = Path(__file__).resolve().parents[2]
HISTORIES = (1, 60)  # young windows; the whole window (N) is added below
T0 = 1_767_258_000  # 2026-01-01 09:00 UTC, 10:00 at UTC+1: the node's period 0 starts then
OFFSET_S = 3600
LITERT_TOLERANCE_UG_M3 = 0.25  # as test_firmware_m4.py: LiteRT's other int16 recipes

_missing = missing_prerequisite()


def _pm_series(n: int, low: float, high: float, seed: int) -> npt.NDArray[np.float32]:
    """A smooth PM trace between the manifest's p01 and p99 (a random walk, clipped)."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(0.0, (high - low) / 40, n)) + (low + high) / 2
    return np.clip(walk, low, high).astype(np.float32)


def _expected_input(
    pm: npt.NDArray[np.float32], k: int, channels: tuple[str, ...], period_s: int, known: bool
) -> npt.NDArray[np.float32]:
    """The contract's input [N * C] of the window ending at period k - 1 (periods from 0)."""
    n = len(pm)
    window = np.full((len(channels), n), np.nan)
    for position in range(n - k, n):
        period = position - (n - k)
        sin, cos = hour_phase(T0 + period * period_s, OFFSET_S) if known else UNKNOWN_HOUR
        by_name = {"hour_sin": sin, "hour_cos": cos}
        for c, name in enumerate(channels):
            window[c, position] = by_name.get(name, float(pm[period]))
    padded = pad_history(window[None], k)[0] if k < n else window
    return padded.T.reshape(-1).astype(np.float32)


def _quantise(values: npt.NDArray[np.float32], scale: float) -> npt.NDArray[np.int16]:
    q = values / np.float32(scale)
    return np.clip(np.sign(q) * np.floor(np.abs(q) + 0.5), -32768, 32767).astype(np.int16)


def _litert(flatbuffer: Path, quantised: npt.NDArray[np.int16]) -> int:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(flatbuffer))
    interpreter.allocate_tensors()
    (given,) = interpreter.get_input_details()
    (output,) = interpreter.get_output_details()
    interpreter.set_tensor(given["index"], quantised.reshape(given["shape"]))
    interpreter.invoke()
    return int(interpreter.get_tensor(output["index"]).reshape(-1)[0])


class Comparison(NamedTuple):
    hour_known: bool
    history: int
    node_ug_m3: float
    litert_ug_m3: float
    input_sum_equal: bool  # the node's quantised input sums as the contract's


def compare_with_litert(model_dir: Path, build_root: Path) -> list[Comparison]:
    """Per (hour known?, history): the node's and LiteRT's outputs. ``build_root`` gets a copy
    of the model directory (the firmware is built per model directory name)."""
    manifest = load_manifest(model_dir)
    device = manifest.files["int8"]
    assert device.input_scale is not None and device.output_scale is not None
    channels = manifest.channel_names
    n, period_s = manifest.window_length, manifest.period_seconds
    measured = [name for name in channels if not is_hour_channel(name)]
    assert measured == [manifest.feature], "PM and the hour only (the node measures no more here)"
    copy = build_root / model_dir.name
    if copy.resolve() != model_dir.resolve():
        shutil.copytree(model_dir, copy, dirs_exist_ok=True)
    elf = build(model_dir.name, model_root=build_root)
    pm = _pm_series(n, manifest.input_range.p01, manifest.input_range.p99, seed=27)
    histories = sorted({k for k in (*HISTORIES, manifest.calibrates_from, n) if k <= n})
    zero, scale = device.output_zero_point or 0, device.output_scale
    rows: list[Comparison] = []
    for known in (True, False):
        with emulated_node(elf) as node:
            node.expect("H,")
            if known:
                node.set_time(T0, OFFSET_S, uptime_ms=0)
            for period in range(n):
                node.add_period(period, [float(pm[period])])
                if period + 1 not in histories:
                    continue
                history, result = node.calibrate_own_window()
                assert history == period + 1 and result is not None, (history, result)
                expected = _quantise(
                    _expected_input(pm, period + 1, channels, period_s, known), device.input_scale
                )
                reference = _litert(model_dir / device.path, expected)
                rows.append(
                    Comparison(
                        hour_known=known,
                        history=history,
                        node_ug_m3=(result[0] - zero) * scale,
                        litert_ug_m3=(reference - zero) * scale,
                        input_sum_equal=result[1] == int(expected.astype(np.int64).sum()),
                    )
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.firmware.hour_node_check MODEL_DIR``: the comparison, printed."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    args = parser.parse_args(argv)
    if _missing is not None:
        parser.error(str(_missing))
    model_dir = args.model_dir.resolve()
    rows = compare_with_litert(model_dir, model_dir.parent)
    for row in rows:
        print(row)
    ok = (
        all(row.input_sum_equal for row in rows)
        and max(abs(row.node_ug_m3 - row.litert_ug_m3) for row in rows) <= LITERT_TOLERANCE_UG_M3
    )
    print("agree" if ok else "DISAGREE", f"(tolerance {LITERT_TOLERANCE_UG_M3} µg/m³)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
