"""Generate the firmware's model constants from a model manifest, so nothing is typed twice.

``firmware/src/model_constants.h`` carries N, the periods from which a young node calibrates,
the grid period and gap policy, the arena size,
the model name and version, the input channels in the model's order (the PMS5003 value it
calibrates first, then covariates the board measures: ``rh`` and ``temp_c`` from its HTS221, and
the hour of the day, ``hour_sin`` and ``hour_cos``, which the node derives from the wall time the
gateway gives it: their positions are kHourSinChannel and kHourCosChannel),
the int8 graph's quantisation and its operator list as an X-macro that the sketch expands into
``MicroMutableOpResolver::Add*`` calls. A host test regenerates the
header from the committed default model and fails if the file in the tree differs.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from tesla_gateway.contract.manifest import Manifest, load_manifest
from tesla_gateway.contract.time_of_day import HOUR_CHANNELS, UNKNOWN_HOUR, is_hour_channel
from tesla_gateway.ota.descriptor import ImageDescriptor
from tesla_gateway.ota.release import key_id, load_public_key
from training.device_ops import unsupported_on_device
from training.errors import TrainingError

__all__ = [
    "FirmwareConstantsError",
    "render_model_constants",
    "render_model_data",
    "render_release_key",
    "resolver_method",
    "slot_bytes",
    "write_model_constants",
]

_SPECIAL = {  # MicroMutableOpResolver spellings that plain CamelCase would get wrong
    "PADV2": "PadV2",
    "SELECT_V2": "SelectV2",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "UnidirectionalSequenceLSTM",
    "L2_NORMALIZATION": "L2Normalization",
    "L2_POOL_2D": "L2Pool2D",
    "SVDF": "Svdf",
}


class FirmwareConstantsError(TrainingError):
    """The manifest cannot drive the firmware (no device graph, or ops the library lacks)."""


def resolver_method(op: str) -> str:
    """``FULLY_CONNECTED`` -> ``FullyConnected`` (called as ``resolver.AddFullyConnected()``)."""
    if op in _SPECIAL:
        return _SPECIAL[op]
    return "".join(part if part[0].isdigit() else part.capitalize() for part in op.split("_"))


FLASH_BYTES = 1024 * 1024  # the nRF52840's flash; the slots sit at its end
FLASH_PAGE_BYTES = 4096  # its erase page
SLOT_HEADROOM = 0.10  # a retrained model of the same shape may grow this much and still fit


def slot_bytes(model_bytes: int) -> int:
    """One A/B slot: the model plus headroom, in whole flash pages (bigger is wasted flash)."""
    needed = model_bytes + math.ceil(model_bytes * SLOT_HEADROOM)
    return -(-needed // FLASH_PAGE_BYTES) * FLASH_PAGE_BYTES


# What the node feeds its model, as the manifest names it: the channel's constant in the
# firmware (model_constants.h's Channel), its unit and the level of the self-test's constant
# window (a plausible reading, so a model that answers it with nonsense fails the self-test;
# the hour channels take UNKNOWN_HOUR there, as on a node the gateway has not told the time).
NODE_CHANNELS = {
    "pm1": ("kPm1", "ug/m3", 20.0),
    "pm2_5": ("kPm2_5", "ug/m3", 20.0),
    "pm10": ("kPm10", "ug/m3", 20.0),
    "rh": ("kRh", "%", 50.0),
    "temp_c": ("kTempC", "degC", 20.0),
    HOUR_CHANNELS[0]: ("kHourSin", "1", UNKNOWN_HOUR[0]),
    HOUR_CHANNELS[1]: ("kHourCos", "1", UNKNOWN_HOUR[1]),
}


def _node_channels(manifest: Manifest, source: str) -> list[tuple[str, str, float]]:
    """The manifest's channels as the node feeds them; refuses what its sensors cannot give."""
    names = manifest.channel_names
    if names[0] != manifest.feature:
        raise FirmwareConstantsError(
            f"{source}: its first channel is {names[0]}, not the {manifest.feature} it calibrates"
        )
    rows = []
    for channel in manifest.input_channels:
        known = NODE_CHANNELS.get(channel.name)
        if known is None or known[1] != channel.unit:
            measured = ", ".join(f"{n} ({u})" for n, (_, u, _) in NODE_CHANNELS.items())
            raise FirmwareConstantsError(
                f"{source} takes {', '.join(names)}; the node measures {measured}: "
                f"{channel.name} ({channel.unit}) is not among them"
            )
        rows.append(known)
    hours = [name for name in names if is_hour_channel(name)]
    if hours and sorted(hours) != sorted(HOUR_CHANNELS):
        raise FirmwareConstantsError(
            f"{source} takes {', '.join(names)}: a model reads both {' and '.join(HOUR_CHANNELS)} "
            "or neither"
        )
    return rows


def _hour_position(manifest: Manifest, name: str) -> int:
    names = manifest.channel_names
    return names.index(name) if name in names else -1


def render_model_constants(manifest: Manifest, source: str) -> str:
    channels = _node_channels(manifest, source)
    device = manifest.files.get("int8")
    if device is None or device.batch != 1 or device.tflm_arena_bytes is None:
        why = (
            f" (export left it out: {manifest.device_graph_absent})"
            if manifest.device_graph_absent
            else ""
        )
        raise FirmwareConstantsError(
            f"{source}: no batch-1 int8 graph with a measured arena{why}; re-export the model"
        )
    missing = unsupported_on_device(device.ops)
    if missing:
        raise FirmwareConstantsError(
            f"{source}: ops {missing} are not in the Arduino TFLite Micro library"
        )
    ops = sorted(device.ops)
    slot = slot_bytes(device.size_bytes)
    region = 2 * FLASH_PAGE_BYTES + 2 * slot
    op_lines = " \\\n".join(f"  X({op}, {resolver_method(op)})" for op in ops)
    channel_list = ", ".join(f"Channel::{constant}" for constant, _, _ in channels)
    levels = ", ".join(f"{level!r}f" for _, _, level in channels)
    hour_sin, hour_cos = (_hour_position(manifest, name) for name in HOUR_CHANNELS)
    measured = sum(1 for name in manifest.channel_names if not is_hour_channel(name))
    return f"""\
// Generated by `python -m training firmware-constants` from {source}. Do not edit:
// regenerate it when the model changes (a host test checks it is current).
#pragma once

#include <stdint.h>

namespace tesla {{
namespace model {{

constexpr char kModelName[] = "{manifest.name}";
constexpr uint32_t kModelVersion = {manifest.version}u;
constexpr uint32_t kWindowLength = {manifest.window_length}u;  // N
// A young node calibrates from this many periods since its first reading on, the window's older
// periods padded with its oldest (the manifest's min_history_periods; N: whole windows only).
constexpr uint32_t kMinHistoryPeriods = {manifest.calibrates_from}u;
// The input [1, N, C]: oldest period first ({manifest.input_order}), a period's channels together,
// in this order; all of them quantised with kInputScale (the graph scales each channel itself:
// {manifest.input_scale!r} for the PM channel).
enum class Channel : uint8_t {{ kPm1, kPm2_5, kPm10, kRh, kTempC, kHourSin, kHourCos }};
constexpr uint32_t kChannelCount = {len(channels)}u;
constexpr Channel kInputChannels[kChannelCount] = {{{channel_list}}};
constexpr float kSelfTestLevels[kChannelCount] = {{{levels}}};  // the self-test's flat window
// The hour of the day (hour_sin, hour_cos) is derived from the wall time the gateway gives the
// node, not measured: its positions in the input (-1: the model does not read it). The node's
// window holds the kMeasuredChannelCount others, in the input's order.
constexpr int32_t kHourSinChannel = {hour_sin};
constexpr int32_t kHourCosChannel = {hour_cos};
constexpr uint32_t kMeasuredChannelCount = {measured}u;
constexpr uint32_t kInputValues = kWindowLength * kChannelCount;  // the input's N * C values
constexpr uint32_t kPeriodSeconds = {manifest.period_seconds}u;
constexpr uint32_t kMaxInterpolatedPeriods = {manifest.gap_policy.max_interpolated_periods}u;
constexpr uint32_t kArenaBytes = {device.tflm_arena_bytes}u;  // measured under TFLite Micro
constexpr uint32_t kModelBytes = {device.size_bytes}u;
// Flash layout at the end of the 1 MB flash: two boot-record pages, then slots A and B,
// each this model + {SLOT_HEADROOM:.0%} headroom in whole {FLASH_PAGE_BYTES} B pages;
// a larger release is refused with too_large.
constexpr uint32_t kSlotBytes = {slot}u;
constexpr uint32_t kSlotRegionBytes = {region}u;
constexpr uint32_t kSlotRegionBase = {FLASH_BYTES - region}u;
constexpr float kInputScale = {device.input_scale!r}f;
constexpr int32_t kInputZeroPoint = {device.input_zero_point};
constexpr float kOutputScale = {device.output_scale!r}f;
constexpr int32_t kOutputZeroPoint = {device.output_zero_point};
constexpr uint32_t kOpCount = {len(ops)}u;

}}  // namespace model
}}  // namespace tesla

// X(TFLITE_OP, ResolverMethod) for every builtin the int8 graph uses.
#define TESLA_MODEL_OPS(X) \\
{op_lines}
"""


def _byte_rows(data: bytes) -> str:
    return "\n".join(
        "    " + ", ".join(f"0x{b:02x}" for b in data[i : i + 16]) + ","
        for i in range(0, len(data), 16)
    )


def render_release_key(public_key_file: Path) -> str:
    """``kReleasePublicKey``: the only key whose releases the node accepts."""
    key = load_public_key(public_key_file)
    return f"""\
// Generated by `python -m training firmware-constants --public-key {public_key_file.name}`.
// The node accepts only model releases signed by the matching private key (key id {key_id(key)}).
#pragma once

#include <stdint.h>

const uint8_t kReleasePublicKey[32] = {{
{_byte_rows(key)}
}};
"""


def render_model_data(model_dir: Path) -> str:
    """The default model built into the sketch (the factory image of slot 0) and its descriptor."""
    manifest = load_manifest(model_dir)
    device = manifest.files["int8"]
    image = (model_dir / device.path).read_bytes()
    if hashlib.sha256(image).hexdigest() != device.sha256:
        raise FirmwareConstantsError(f"{model_dir / device.path} does not match its manifest")
    descriptor = ImageDescriptor.of_image(
        manifest, image, arena_bytes=device.tflm_arena_bytes or 0
    ).encode()
    return f"""\
// Generated by `python -m training firmware-constants --model-data` from {model_dir.name}
// (v{manifest.version}). Do not edit.
#include <stdint.h>

alignas(16) extern const unsigned char kModelData[] = {{
{_byte_rows(image)}
}};
extern const unsigned int kModelDataSize = {len(image)}u;
extern const unsigned char kModelDescriptor[] = {{
{_byte_rows(descriptor)}
}};
"""


def write_model_constants(
    model_dir: Path,
    out: Path,
    *,
    public_key: Path | None = None,
    model_data: Path | None = None,
) -> Path:
    manifest = load_manifest(model_dir)
    source = f"{model_dir.name}/manifest.json (v{manifest.version})"
    text = render_model_constants(manifest, source)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    if public_key is not None:
        (out.parent / "release_key.h").write_text(render_release_key(public_key), "utf-8")
    if model_data is not None:
        model_data.parent.mkdir(parents=True, exist_ok=True)
        model_data.write_text(render_model_data(model_dir), encoding="utf-8")
    return out
