"""The firmware's portable C++ core: host tests on the shared vectors, and a Cortex-M4 build.

No Arduino board exists here; the core is built with g++ (libsodium for Ed25519) and runs
tests/vectors/*.json, the same files the Python tests run, then compiled with Debian's
arm-none-eabi-g++ for the nRF52840's Cortex-M4F to measure its code and static RAM.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.ota.descriptor import ImageDescriptor
from training.device_ops import ARDUINO_TFLM_OPS
from training.firmware_constants import (
    render_model_constants,
    render_model_data,
    resolver_method,
)

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "firmware"
VECTORS = ROOT / "tests" / "vectors"
DEFAULT_MODEL = ROOT / "models" / "pm10-ispra-1min"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("firmware-build")


@pytest.fixture(scope="module")
def host_binary(build_dir: Path) -> Path:
    subprocess.run(
        ["make", "-C", str(FIRMWARE), f"BUILD={build_dir}", f"{build_dir}/test_firmware"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return build_dir / "test_firmware"


def _run(binary: Path, vectors: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), str(vectors)], capture_output=True, text=True, timeout=120, check=False
    )


def test_host_core_passes_the_shared_vectors(host_binary: Path) -> None:
    result = _run(host_binary, VECTORS)
    assert result.returncode == 0, result.stderr
    checks = int(re.search(r"(\d+) checks, 0 failures", result.stdout).group(1))  # type: ignore[union-attr]
    assert checks > 200


def test_host_core_notices_a_vector_it_disagrees_with(host_binary: Path, tmp_path: Path) -> None:
    """Proof the comparison is live: one changed expected answer makes the C++ side fail."""
    shutil.copy(VECTORS / "line_protocol.json", tmp_path)
    document = json.loads((VECTORS / "ota_protocol.json").read_text())
    step = document["scenarios"][0]["steps"][1]
    step["answer_hex"] = step["answer_hex"].replace("4f2c532c30", "4f2c532c32", 1)  # O,S,0 -> 2
    document["status_codes"][3]["message"] = "changed on one side only"
    (tmp_path / "ota_protocol.json").write_text(json.dumps(document))
    windows = json.loads((VECTORS / "window_gap_policy.json").read_text())
    scenario = next(s for s in windows["scenarios"] if s["name"] == "one rh missing, interpolated")
    step = next(p for p in scenario["periods"] if p.get("window"))
    step["window"][-2] += 0.01  # the newest rh of the first valid window
    (tmp_path / "window_gap_policy.json").write_text(json.dumps(windows))
    hours = json.loads((VECTORS / "window_hours.json").read_text())
    young = next(
        s for s in hours["scenarios"] if s["name"] == "young window repeats its oldest hour"
    )
    first = next(step for step in young["steps"] if step.get("input"))
    first["input"][1] += 1e-5  # the hour_sin of a padded position, beyond float's rounding
    (tmp_path / "window_hours.json").write_text(json.dumps(hours))
    result = _run(host_binary, tmp_path)
    assert result.returncode == 1
    assert "complete transfer step 2" in result.stderr
    assert "message of 3" in result.stderr
    differs = f"one rh missing, interpolated: period {step['period']}: 1 values differ"
    assert differs in result.stderr
    assert f"oldest hour: period {first['period']}: 1 values differ" in result.stderr


@pytest.mark.skipif(shutil.which("arm-none-eabi-g++") is None, reason="no ARM toolchain")
def test_core_builds_for_cortex_m4_and_fits(build_dir: Path, record_property: object) -> None:
    result = subprocess.run(
        ["make", "-C", str(FIRMWARE), f"BUILD={build_dir}", "size"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    totals = next(line for line in result.stdout.splitlines() if "(TOTALS)" in line).split()
    text, data, bss = (int(value) for value in totals[:3])
    print(f"cortex-m4 -Os portable core: code {text} B, data {data} B, bss {bss} B")
    record_property("cortex_m4_code_bytes", text)  # type: ignore[operator]
    record_property("cortex_m4_static_ram_bytes", data + bss)  # type: ignore[operator]
    assert 0 < text < 16 * 1024  # the nRF52840 has 1 MB flash; the core must stay small
    # The window (N floats) dominates the static RAM; 256 KB is shared with the model arena.
    manifest = load_manifest(DEFAULT_MODEL)
    assert bss >= 4 * manifest.window_length
    assert data + bss < 8 * 1024


def test_model_constants_header_is_generated_from_the_default_manifest() -> None:
    manifest = load_manifest(DEFAULT_MODEL)
    source = f"{DEFAULT_MODEL.name}/manifest.json (v{manifest.version})"
    committed = (FIRMWARE / "src" / "model_constants.h").read_text(encoding="utf-8")
    assert committed == render_model_constants(manifest, source), (
        "regenerate: .venv/bin/python -m training firmware-constants "
        "--model models/pm10-ispra-1min --out firmware/src/model_constants.h"
    )


def test_model_constants_say_from_how_many_periods_a_young_node_calibrates() -> None:
    """The manifest's min_history_periods; a model without it calibrates whole windows only."""
    manifest = load_manifest(DEFAULT_MODEL)
    n = manifest.window_length
    for given, expected in ((None, n), (1, 1), (60, 60)):
        header = render_model_constants(
            manifest.model_copy(update={"min_history_periods": given}), "x"
        )
        assert f"constexpr uint32_t kMinHistoryPeriods = {expected}u;" in header


def test_the_factory_descriptor_states_the_built_in_min_history() -> None:
    """The factory image's descriptor, kept in slot 0's boot record, states the same value as
    kMinHistoryPeriods (format 2), so the slot's record and the firmware never disagree."""
    text = render_model_data(DEFAULT_MODEL)
    rows = text.split("kModelDescriptor[] = {", 1)[1].split("};", 1)[0]
    raw = bytes(int(value, 16) for value in re.findall(r"0x([0-9a-f]{2})", rows))
    descriptor = ImageDescriptor.decode(raw)
    manifest = load_manifest(DEFAULT_MODEL)
    header = render_model_constants(manifest, "x")
    built_in = f"constexpr uint32_t kMinHistoryPeriods = {descriptor.min_history_periods}u;"
    assert descriptor.min_history_periods == manifest.calibrates_from and built_in in header


def test_model_constants_give_the_node_the_covariate_models_channels_in_order() -> None:
    """The covariate default: three channels in the manifest's order, a self-test level each;
    a channel the node cannot measure, a wrong unit, or PM not first is refused by name."""
    from tesla_gateway.contract.manifest import InputChannel
    from training.firmware_constants import FirmwareConstantsError

    manifest = load_manifest(ROOT / "models" / "pm10-ispra-1min-rh-temp")
    header = render_model_constants(manifest, "covariates")
    assert "constexpr uint32_t kChannelCount = 3u;" in header
    assert "kInputChannels[kChannelCount] = {Channel::kPm10, Channel::kRh, Channel::kTempC};" in (
        header
    )
    assert "kSelfTestLevels[kChannelCount] = {20.0f, 50.0f, 20.0f};" in header
    pm, rh, temp = manifest.input_channels
    for channels, message in (
        ([pm, InputChannel(name="pressure", unit="hPa")], r"pressure \(hPa\) is not among"),
        ([pm, InputChannel(name="temp_c", unit="degF")], r"temp_c \(degF\) is not among"),
        ([rh, pm, temp], "first channel is rh, not the pm10"),
    ):
        with pytest.raises(FirmwareConstantsError, match=message):
            render_model_constants(manifest.model_copy(update={"input_channels": channels}), "x")


def test_model_constants_place_the_hour_channels_the_node_derives() -> None:
    """A model reading the hour: its positions, the measured channels the window holds, and
    UNKNOWN_HOUR in the self-test's flat window; one hour channel without the other is refused."""
    from tesla_gateway.contract.manifest import InputChannel
    from training.firmware_constants import FirmwareConstantsError

    manifest = load_manifest(ROOT / "models" / "pm10-ispra-1min-rh-temp")
    pm, rh, temp = manifest.input_channels
    sin, cos = InputChannel(name="hour_sin", unit="1"), InputChannel(name="hour_cos", unit="1")
    header = render_model_constants(
        manifest.model_copy(update={"input_channels": [pm, rh, cos, temp, sin]}), "x"
    )
    assert (
        "kInputChannels[kChannelCount] = {Channel::kPm10, Channel::kRh, Channel::kHourCos, "
        "Channel::kTempC, Channel::kHourSin};" in header
    )
    assert "kSelfTestLevels[kChannelCount] = {20.0f, 50.0f, 0.0f, 20.0f, 0.0f};" in header
    assert "constexpr int32_t kHourSinChannel = 4;" in header
    assert "constexpr int32_t kHourCosChannel = 2;" in header
    assert "constexpr uint32_t kMeasuredChannelCount = 3u;" in header
    plain = render_model_constants(manifest, "x")
    assert "kHourSinChannel = -1;" in plain and "kMeasuredChannelCount = 3u;" in plain
    with pytest.raises(FirmwareConstantsError, match="both hour_sin and hour_cos or neither"):
        render_model_constants(manifest.model_copy(update={"input_channels": [pm, sin]}), "x")


# (op, type of its first input) pairs the node runs with a kernel of the Arduino library whose
# int16 path the emulated node's golden-window test (test_firmware_m4.py) has exercised for the
# default graphs. The resolver's own kernels (firmware/tflm/device_op_resolver.cpp) are added
# from its source below. A pair outside both is a kernel nobody has run: this host test can only
# see names and types, the emulated node is what shows a kernel computes right.
LIBRARY_KERNELS_RUN_ON_THE_NODE = frozenset(
    (op, "int16")
    for op in ("ABS", "ADD", "MEAN", "MUL", "RESHAPE", "SOFTMAX", "STRIDED_SLICE", "SUB", "SUM")
)


def _resolver_int16_kernels() -> set[tuple[str, str]]:
    source = (FIRMWARE / "tflm" / "device_op_resolver.cpp").read_text(encoding="utf-8")
    return {
        (op, "int16")
        for op in re.findall(r"op == tflite::BuiltinOperator_(\w+)\) return &", source)
    }


def _op_input_types(flatbuffer: Path) -> set[tuple[str, str]]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(flatbuffer))
    types = {t["index"]: t["dtype"].__name__ for t in interpreter.get_tensor_details()}
    return {
        (op["op_name"], types[op["inputs"][0]])
        for op in interpreter._get_ops_details()  # LiteRT's only per-op listing
    }


@pytest.mark.parametrize(
    "model", sorted(p.parent.name for p in (ROOT / "models").glob("*/manifest.json"))
)
def test_every_default_device_graph_runs_on_the_arduino_library(model: str) -> None:
    manifest = load_manifest(ROOT / "models" / model)
    pairs = _op_input_types(ROOT / "models" / model / manifest.files["int8"].path)
    resolver = _resolver_int16_kernels()
    assert resolver == {
        (op, "int16") for op in ("FULLY_CONNECTED", "MEAN", "MUL", "RSQRT", "SUM", "TRANSPOSE")
    }
    unproven = pairs - LIBRARY_KERNELS_RUN_ON_THE_NODE - resolver
    assert not unproven, (
        f"{sorted(unproven)}: no kernel the node is known to run; check them on the emulated "
        "node (tests/firmware/test_firmware_m4.py) and list them here"
    )
    ops = manifest.files["int8"].ops
    assert set(ops) <= ARDUINO_TFLM_OPS
    assert "BATCH_MATMUL" not in ops
    header = render_model_constants(manifest, model)
    registered = re.findall(r"^  X\(([A-Z0-9_]+), (\w+)\)", header, re.MULTILINE)
    assert [op for op, _ in registered] == sorted(ops)
    assert all(method == resolver_method(op) for op, method in registered)


@pytest.mark.skipif(shutil.which("arm-none-eabi-g++") is None, reason="no ARM toolchain")
def test_sketch_folder_is_assembled_with_generated_key_and_model(
    build_dir: Path, tmp_path: Path
) -> None:
    """arduino-cli and the board are not here; the assembly and the generated sources are."""
    from training.release import keygen

    keys = keygen(tmp_path / "keys")
    subprocess.run(
        ["make", "-C", str(FIRMWARE), f"BUILD={build_dir}", "sketch",
         f"RELEASE_KEY={keys.public_path}", f"PYTHON={sys.executable}"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    sketch = build_dir / "sketch" / "tesla_node"
    names = ("tesla_node.ino", "arduino_flash.cpp", "arduino_signature.cpp", "model_data.cpp")
    shared = (
        "device_op_resolver.cpp",
        "model_runner.cpp",
        "dot_s16_s8.h",
        "int16_kernels.h",
        "strided_slice_s16.h",
    )
    for name in (*names, *shared):
        assert (sketch / name).is_file(), name
    key_header = (sketch / "src" / "release_key.h").read_text()
    key = bytes.fromhex(keys.public_path.read_text())
    assert ", ".join(f"0x{b:02x}" for b in key[:16]) in key_header
    subprocess.run(
        ["arm-none-eabi-g++", "-std=c++17", "-mcpu=cortex-m4", "-mthumb", "-Os", "-c",
         str(sketch / "model_data.cpp"), "-o", str(tmp_path / "model_data.o")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    size = subprocess.run(
        ["arm-none-eabi-size", str(tmp_path / "model_data.o")],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()[1].split()  # fmt: skip
    manifest = load_manifest(DEFAULT_MODEL)
    assert int(size[0]) >= manifest.files["int8"].size_bytes + 88  # image + descriptor in flash


@pytest.mark.skipif(shutil.which("arm-none-eabi-g++") is None, reason="no ARM toolchain")
def test_sketch_compiles_against_the_real_arduino_libraries(
    build_dir: Path, tmp_path: Path
) -> None:
    """The sketch and every shim beside it compile against the Arduino_TensorFlowLite and Crypto
    headers a user installs (found as firmware/m4/m4.mk finds them); only the board's core API is
    declared (firmware/test/arduino_core/). A call the library does not have fails the check."""
    from training.release import keygen

    keys = keygen(tmp_path / "keys")
    common = [f"BUILD={build_dir}", f"RELEASE_KEY={keys.public_path}", f"PYTHON={sys.executable}"]
    result = subprocess.run(
        ["make", "-C", str(FIRMWARE), *common, "sketch-check"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if result.returncode != 0 and "skip:" in result.stderr:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checked = re.findall(r"^check (\S+)$", result.stdout, re.MULTILINE)
    assert {"tesla_node.ino", "device_op_resolver.cpp", "arduino_signature.cpp"} <= set(checked)
    assert {"arduino_flash.cpp", "arduino_io.cpp", "arduino_environment.cpp"} <= set(checked)
    assert "model_runner.cpp" in checked  # the inference code the emulated node runs too
    # A shim calling what the library does not have (the light one, to keep this quick).
    shim = build_dir / "sketch" / "tesla_node" / "arduino_signature.cpp"
    shim.write_text(shim.read_text() + "\nbool drifted() { return Ed25519::no_such_call(); }\n")
    drifted = subprocess.run(
        ["make", "-C", str(FIRMWARE), *common, "sketch-compile",
         "SKETCH_FILES=arduino_signature.cpp"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert drifted.returncode != 0
    assert "no_such_call" in drifted.stderr
    # The sketch for the covariate model: three channels into the window and the model.
    covariate = [*common, f"MODEL={ROOT / 'models' / 'pm10-ispra-1min-rh-temp'}"]
    subprocess.run(
        ["make", "-C", str(FIRMWARE), *covariate, "sketch"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    sketch = subprocess.run(
        ["make", "-C", str(FIRMWARE), *covariate, "sketch-compile", "SKETCH_FILES=tesla_node.ino"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert sketch.returncode == 0, sketch.stdout[-3000:] + sketch.stderr[-3000:]
    constants = build_dir / "sketch" / "tesla_node" / "src" / "model_constants.h"
    assert "kChannelCount = 3u" in constants.read_text()


def test_int16_kernels_give_the_library_reference_kernels_outputs(build_dir: Path) -> None:
    """firmware/tflm/int16_kernels.h (the node's int16 broadcast MUL, SUM and MEAN) against the
    Arduino library's reference kernels on random tensors with extreme values, bit for bit."""
    result = subprocess.run(
        ["make", "-C", str(FIRMWARE), f"BUILD={build_dir}", "int16-kernels-test"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if result.returncode != 0 and "skip:" in result.stderr:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = int(re.search(r"(\d+) checks, 0 failures", result.stdout).group(1))  # type: ignore[union-attr]
    assert checks > 500_000
