"""Measures the node firmware on the emulated Cortex-M4F: instructions per inference, flash, RAM.

Run by `make -C firmware m4-bench` (`M4_BENCH_MODELS="a b"` measures only those and keeps the
others' entries; a name with '/' is a model directory elsewhere, e.g. under firmware/build);
writes docs/benchmarks/node-m4/results.json. Method (see
docs/benchmarks/node-m4/README.md): qemu -icount shift=0 makes every executed instruction one
nanosecond of virtual time; the board's SysTick runs on the 25 MHz core clock of that virtual
time, so one tick is 40 instructions. The node times Invoke() alone with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tesla_gateway.contract.manifest import load_manifest  # noqa: E402
from tests.firmware.qemu_node import (  # noqa: E402
    INSTRUCTIONS_PER_TICK,
    bench_windows,
    build,
    emulated_node,
)

MODELS = ("pm10-ispra-1min", "pm2_5-antwerp-1h", "pm10-ispra-1min-rh-temp")
KERNELS = ("cmsis-nn", "portable")
NRF52840_HZ = 64_000_000
NRF52840_FLASH = 1024 * 1024
NRF52840_RAM = 256 * 1024
STACK = 16 * 1024  # firmware/m4/mps2_an386.ld _stack_size
WINDOWS = 8


def sections(elf: Path) -> dict[str, int]:
    command = ["arm-none-eabi-size", "-A", str(elf)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout  # noqa: S603
    sizes = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            sizes[parts[0]] = int(parts[1])
    return sizes


def measure(model: str, kernels: str, model_root: Path = ROOT / "models") -> dict[str, object]:
    manifest = load_manifest(model_root / model)
    elf = build(model, kernels, model_root)
    windows = bench_windows(manifest, WINDOWS, seed=0)
    with emulated_node(elf) as node:
        node.expect("H,")
        loop_ticks = node.count_loop(1_000_000)
        ticks = [node.calibrate(w)[1] for w in windows]
        per_op = node.profile(windows[0])
        node.send("#M")
        _, arena_used, arena_bytes, model_bytes, heap_used = node.expect("#M,").split(",")
    instructions = [t * INSTRUCTIONS_PER_TICK for t in ticks]
    s = sections(elf)
    flash_firmware = sum(
        s.get(k, 0) for k in (".vectors", ".text", ".ARM.exidx", ".init_array", ".data")
    )
    slot_region = s[".slots"]  # boot records + slots A/B, sized to the model (model_constants.h)
    ram_static = s.get(".data", 0) + s.get(".bss", 0)
    ram_total = ram_static + STACK + int(heap_used)
    return {
        "model": model,
        "kernels": kernels,
        "window_length": manifest.window_length,
        "channels": list(manifest.channel_names),
        "counter_check": {
            "instructions": 2_000_000,
            "measured": loop_ticks * INSTRUCTIONS_PER_TICK,
        },
        "instructions_per_inference": {
            "min": min(instructions),
            "median": int(np.median(instructions)),
            "max": max(instructions),
        },
        "per_op_flat_window": {
            op: {"calls": calls, "instructions": count} for op, (calls, count) in per_op.items()
        },
        "ms_at_64mhz_1ipc": round(max(instructions) / NRF52840_HZ * 1e3, 2),
        "flatbuffer_bytes": int(model_bytes),
        "arena_bytes": int(arena_bytes),
        "arena_used_bytes": int(arena_used),
        "flash": {
            "text_rodata_data": flash_firmware,
            "slot_region": slot_region,
            "total": flash_firmware + slot_region,
            "share": round((flash_firmware + slot_region) / NRF52840_FLASH, 3),
        },
        "ram": {
            "data": s.get(".data", 0),
            "bss": s.get(".bss", 0),
            "stack": STACK,
            "heap_used": int(heap_used),
            "total": ram_total,
            "share": round(ram_total / NRF52840_RAM, 3),
        },
    }


def main(models: list[str]) -> int:
    out = ROOT / "docs" / "benchmarks" / "node-m4" / "results.json"
    # A name is a default model under models/; a path (with '/') any other model directory.
    places = [
        (Path(m).name, Path(m).resolve().parent) if "/" in m else (m, ROOT / "models")
        for m in models or MODELS
    ]
    measured = [measure(name, k, root) for name, root in places for k in KERNELS]
    kept = [] if not models else json.loads(out.read_text(encoding="utf-8"))
    fresh = {(r["model"], r["kernels"]) for r in measured}
    results = [r for r in kept if (r["model"], r["kernels"]) not in fresh] + measured
    order = {name: i for i, name in enumerate(MODELS)}
    results.sort(key=lambda r: (order.get(str(r["model"]), len(order)), str(r["model"])))
    out.write_text(json.dumps(results, indent=2) + "\n")
    for r in measured:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
