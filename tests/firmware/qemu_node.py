"""The node firmware built for the emulated Cortex-M4F board and driven over its UART.

`make -C firmware m4` builds it (objects cached under firmware/build/m4, so only the first build
compiles TFLite Micro); qemu-system-arm runs it on mps2-an386 with UART0 on stdio and
``-icount shift=0`` (one instruction = 1 ns of virtual time, so the board's 25 MHz SysTick
advances once every 40 instructions). Every run has a deadline and is killed at the end.
"""

from __future__ import annotations

import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt

from devkit.pty import PtySerial
from tesla_gateway.contract.manifest import Manifest
from tesla_gateway.sources.line_protocol import encode_time
from tests.firmware.serial_tap import LineFaults, SerialTap, TapLog

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "firmware"
INSTRUCTIONS_PER_TICK = 40  # 25 MHz SysTick under -icount shift=0 (1 ns per instruction)
VALUES_PER_LINE = 24  # '#V' lines stay under the node's 512-byte line limit
MAX_LINE_BYTES = 511  # firmware/src/line_protocol.h kMaxLineBytes, without the LF


def float_bits(value: float) -> str:
    """A float32 as the node's test lines carry it: the 8 hex digits of its IEEE-754 bits (exact;
    the emulated node links no decimal float parser, firmware/m4/node_main.cpp)."""
    return f"{int(np.float32(value).view(np.uint32)):08x}"


# Uniform ranges of the covariate channels in the benchmark's random windows: the humidity and
# temperature an outdoor sensor meets (the PM channel uses the manifest's p01..p99).
COVARIATE_RANGES = {"rh": (20.0, 95.0), "temp_c": (-5.0, 35.0)}
FLAT_LEVELS = {"rh": 50.0, "temp_c": 20.0}  # the flat window: PM 20 ug/m3, as the self-test


def bench_windows(manifest: Manifest, count: int, seed: int) -> list[npt.NDArray[np.float32]]:
    """A flat window and ``count - 1`` uniform random ones, each [N * C] as the node takes them
    (oldest period first, a period's channels together)."""
    rng = np.random.default_rng(seed)
    n = manifest.window_length
    ranges = [(manifest.input_range.p01, manifest.input_range.p99)] + [
        COVARIATE_RANGES[name] for name in manifest.channel_names[1:]
    ]
    flat = [20.0] + [FLAT_LEVELS[name] for name in manifest.channel_names[1:]]
    windows = [np.tile(np.asarray(flat, np.float32), n)]
    for _ in range(count - 1):
        columns = [rng.uniform(low, high, n) for low, high in ranges]
        windows.append(np.stack(columns, axis=1).astype(np.float32).reshape(-1))
    return windows


def library_dirs() -> list[Path]:
    """Where the Arduino libraries are looked for, in order (as firmware/m4/m4.mk)."""
    dirs = [Path(p) for p in os.environ.get("ARDUINO_LIBRARIES", "").split() if p]
    dirs += [Path.home() / "Arduino" / "libraries", ROOT.parent / "shared/vendor/arduino-libraries"]
    return dirs


def missing_prerequisite() -> str | None:
    """Why the emulated node cannot be built or run here, or None."""
    for tool in ("arm-none-eabi-g++", "qemu-system-arm", "make"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-system-deps.sh installs it)"
    for library, marker in (("Arduino_TensorFlowLite", "src/TensorFlowLite.h"),
                            ("Crypto", "Ed25519.h")):  # fmt: skip
        if not any((d / library / marker).is_file() for d in library_dirs()):
            searched = ", ".join(str(d) for d in library_dirs())
            return f"the Arduino library {library} is in none of: {searched}"
    return None


def build(model: str, kernels: str = "cmsis-nn", model_root: Path = ROOT / "models") -> Path:
    """Builds (or finds up to date) the firmware for one model directory under ``model_root``."""
    elf = FIRMWARE / "build" / "m4" / model / f"node-{kernels}.elf"
    subprocess.run(
        ["make", "-C", str(FIRMWARE), f"-j{os.cpu_count() or 2}", f"PYTHON={sys.executable}",
         f"KERNELS={kernels}",
         f"M4_MODELS={model}", f"M4_MODEL_ROOT={model_root.resolve()}",
         str(elf.relative_to(FIRMWARE))],
        check=True, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    return elf


class EmulatedNode:
    """One qemu process: lines in on stdin, lines out of stdout (read by a thread)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._process.stdout is not None
        for raw in self._process.stdout:
            self._lines.put(raw.decode("ascii", "replace").rstrip("\r\n"))

    def send(self, line: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(line.encode("ascii") + b"\n")
        self._process.stdin.flush()

    def expect(self, prefix: str, timeout: float = 60.0) -> str:
        """The next line that starts with `prefix`; fails on a panic or after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {prefix!r} line from the emulated node in {timeout} s")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line.startswith("!panic"):
                raise RuntimeError(f"the emulated node panicked: {line}")
            if line.startswith(prefix):
                return line

    def calibrate(self, window: npt.NDArray[np.float32]) -> tuple[int, int, int]:
        """(int16 output, SysTick ticks of Invoke, sum of the quantised inputs)."""
        for offset in range(0, len(window), VALUES_PER_LINE):
            values = ",".join(float_bits(v) for v in window[offset : offset + VALUES_PER_LINE])
            line = f"#V,{offset},{values}"
            assert len(line) <= MAX_LINE_BYTES, "the node would drop this line"
            self.send(line)
        self.send("#I")
        fields = self.expect("#O,").split(",")
        return int(fields[1]), int(fields[3]), int(fields[4])

    def add_period(self, period: int, values: Sequence[float | None]) -> None:
        """One period's readings into the node's own window (None: no reading of a channel)."""
        text = ",".join("-" if v is None else float_bits(v) for v in values)
        self.send(f"#A,{period},{text}")

    def set_time(self, unix_s: int, utc_offset_s: int, uptime_ms: int = 0) -> None:
        """The gateway's ``T`` line, taken as received at ``uptime_ms`` of the node's uptime
        (``#U``), so that period ``p`` of :meth:`add_period` starts at the wall time
        ``unix_s - uptime_ms / 1000 + p * period_seconds``: the hour channels of a model that
        reads them follow (firmware/src/model_input.h)."""
        self.send(f"#U,{uptime_ms}")
        self.send(encode_time(unix_s, utc_offset_s).decode("ascii").rstrip("\n"))

    def wall_time(self) -> tuple[float, int] | None:
        """(Unix time at uptime 0, standard UTC offset) of the node's clock, None if unknown."""
        self.send("#T")
        _, known, seconds, millis, offset = self.expect("#T,").split(",")
        if known == "0":
            return None
        return int(seconds) + int(millis) / 1000, int(offset)

    def calibrate_own_window(self) -> tuple[int, tuple[int, int] | None]:
        """(history, (int16 output, sum of the quantised inputs) or None if not valid) of the
        node's own window, calibrated as the sketch calibrates it."""
        self.send("#W")
        fields = self.expect("#W,").split(",")
        if fields[2] == "-":
            return int(fields[1]), None
        return int(fields[1]), (int(fields[2]), int(fields[4]))

    def profile(self, window: npt.NDArray[np.float32]) -> dict[str, tuple[int, int]]:
        """{op: (calls, instructions)} of one inference with a per-op profiler attached."""
        self.calibrate(window)
        self.send("#P")
        ops = {}
        while (line := self.expect("#P,")) != "#P,end":
            _, op, calls, ticks = line.split(",")
            ops[op] = (int(calls), int(ticks) * INSTRUCTIONS_PER_TICK)
        return ops

    def count_loop(self, iterations: int) -> int:
        self.send(f"#C,{iterations}")
        return int(self.expect("#C,").split(",")[2])


def _wait_for_boot_hello(pty: Path, timeout_s: float = 60.0) -> None:
    """Reads the node's boot output (its unsolicited hello) off the pty, so the gateway that
    opens it next starts from a quiet line, as with a board that was already running."""
    fd = os.open(pty, os.O_RDWR | os.O_NOCTTY)
    try:
        tty.setraw(fd)
        seen = b""
        deadline = time.monotonic() + timeout_s
        while b"\nH," not in b"\n" + seen or not seen.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no hello from the emulated node on {pty}: {seen[-200:]!r}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                seen += os.read(fd, 4096)
    finally:
        os.close(fd)


@contextmanager
def node_on_pty(elf: Path, link: Path) -> Iterator[subprocess.Popen[bytes]]:
    """qemu with UART0 on a pty of its own, reachable at ``link`` (as udev's by-id path would
    be); the gateway opens that path. No -icount: this run is about behaviour, not counts."""
    with _qemu_on_pty(elf) as (process, pty):
        link.unlink(missing_ok=True)
        link.symlink_to(pty)
        try:
            yield process
        finally:
            link.unlink(missing_ok=True)


@contextmanager
def node_behind_tap(elf: Path, gateway_side: PtySerial, faults: LineFaults) -> Iterator[TapLog]:
    """qemu as in :func:`node_on_pty`, reached through a :class:`SerialTap` that injects
    ``faults`` between the gateway's pty (``gateway_side.path``) and the node's UART."""
    with _qemu_on_pty(elf) as (_, pty):
        tap = SerialTap(pty, gateway_side, faults)
        tap.start()
        try:
            yield tap.log
        finally:
            tap.stop()


@contextmanager
def _qemu_on_pty(elf: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    process = subprocess.Popen(
        ["qemu-system-arm", "-M", "mps2-an386", "-display", "none", "-monitor", "none",
         "-serial", "pty", "-kernel", str(elf)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        announced = process.stdout.readline().decode("ascii", "replace")
        if "/dev/pts/" not in announced:
            raise RuntimeError(f"qemu did not announce its pty: {announced!r}")
        pty = Path(announced.split("redirected to ", 1)[1].split()[0])
        _wait_for_boot_hello(pty)
        yield process, pty
    finally:
        process.kill()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def emulated_node(elf: Path) -> Iterator[EmulatedNode]:
    process = subprocess.Popen(
        ["qemu-system-arm", "-M", "mps2-an386", "-display", "none", "-monitor", "none",
         "-serial", "stdio", "-icount", "shift=0", "-kernel", str(elf)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield EmulatedNode(process)
    finally:
        process.kill()
        process.wait(timeout=30)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
