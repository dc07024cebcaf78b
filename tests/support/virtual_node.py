"""A virtual Arduino node: the real line and OTA protocols over a pty, the real TFLite Micro.

No Nano 33 BLE Sense exists here, so this stands in for one (and mirrors the firmware's
OTA receiver in firmware/src/ota_receiver.cpp): two model slots (A/B) in memory, an OTA session
that writes the inactive slot, checks the descriptor's Ed25519 signature at the handshake and
the image's sha256 at finish, activates on commit, and self-tests the new model on "boot" under
the ``tflite-micro`` interpreter, falling back to the previous slot if it fails to load or
produces nonsense. It reports raw and on-device calibrated PM10 with the active model version.

All pty I/O runs in the node's own thread (faults such as a cut link are injected there too);
tests read its state through the lock-protected accessors.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from devkit.pty import PtySerial
from tesla_gateway.contract.readings import ReadingRejectedError
from tesla_gateway.contract.series import window_is_valid
from tesla_gateway.ota.descriptor import ImageDescriptor
from tesla_gateway.ota.errors import MalformedReleaseError, OtaFrameError
from tesla_gateway.ota.protocol import (
    Abort,
    Begin,
    Chunk,
    Commit,
    Finish,
    OtaMessage,
    OtaStatus,
    Status,
    chunk_count,
    crc32,
    decode_ota,
    encode_ota,
)
from tesla_gateway.sources.line_protocol import (
    HelloRequest,
    LineSplitter,
    NodeReading,
    OtaFrame,
    decode_line,
    encode_hello,
    encode_reading,
)

__all__ = ["FirmwareProfile", "NodeFaults", "OtaReceiver", "Slot", "VirtualNode", "self_test"]

SELF_TEST_LEVEL = 20.0  # µg/m³: the known window a new model must calibrate sensibly


@dataclass(frozen=True)
class FirmwareProfile:
    """What the firmware was built for (firmware/src/model_constants.h on a real board)."""

    model_name: str
    window_length: int
    arena_bytes: int
    input_scale: float
    output_scale: float
    slot_bytes: int = 64 * 1024


@dataclass
class Slot:
    image: bytes
    descriptor: ImageDescriptor


@dataclass
class NodeFaults:
    """Faults injected on the node side; each fires once."""

    corrupt_chunks: set[int] = field(default_factory=set)  # flip a payload bit before the CRC
    cut_link_after_chunk: int | None = None  # unplug the "USB cable" after storing this chunk
    cut_link_s: float = 0.3
    usb_reboot: bool = False  # commit resets the board: the USB port drops before any answer
    # The gateway read the boot hello from the port's buffer and started the update; the node's
    # answer to the gateway's hello request ("Q") follows the first OTA frame, whose own answer
    # lags by ``slow_first_answer_s`` (a slow UART): two hellos while the update is starting.
    hello_during_first_frame: bool = False
    slow_first_answer_s: float = 0.4


@dataclass
class _Session:
    begin: Begin
    descriptor: ImageDescriptor
    total: int
    buffer: bytearray
    next_seq: int = 0
    verified: bool = False


def self_test(image: bytes, profile: FirmwareProfile) -> float | None:
    """Calibrate a constant window under TFLite Micro; the output, or None if the model fails."""
    from tflite_micro.python.tflite_micro import runtime

    try:
        interpreter = runtime.Interpreter.from_bytes(image, arena_size=profile.arena_bytes)
        shape = tuple(int(n) for n in interpreter.get_input_details(0)["shape"])
        if shape != (1, profile.window_length):
            return None
        quantised = round(SELF_TEST_LEVEL / profile.input_scale)
        interpreter.set_input(np.full(shape, quantised, dtype=np.int16), 0)
        interpreter.invoke()
        value = float(np.asarray(interpreter.get_output(0)).reshape(-1)[0]) * profile.output_scale
    except Exception:  # noqa: BLE001 - on the board any load/alloc/invoke failure is "no model"
        return None
    return value if math.isfinite(value) and 0.0 <= value < 1000.0 else None


class _Model:
    """The active slot loaded into a TFLite Micro interpreter."""

    def __init__(self, image: bytes, profile: FirmwareProfile) -> None:
        from tflite_micro.python.tflite_micro import runtime

        self._profile = profile
        self._interpreter = runtime.Interpreter.from_bytes(image, arena_size=profile.arena_bytes)

    def calibrate(self, window: np.ndarray) -> float:
        scale = self._profile.input_scale
        quantised = np.clip(np.round(window / scale), -32768, 32767).astype(np.int16)
        self._interpreter.set_input(quantised[None, :], 0)
        self._interpreter.invoke()
        out = np.asarray(self._interpreter.get_output(0)).reshape(-1)[0]
        return float(out) * self._profile.output_scale


class VirtualNode:
    """One node on one pty; ``start`` runs it in a thread until ``stop``."""

    def __init__(
        self,
        device: PtySerial,
        *,
        node_id: str,
        public_key: bytes,
        profile: FirmwareProfile,
        image: bytes,
        descriptor: ImageDescriptor,
        history: np.ndarray,
        faults: NodeFaults | None = None,
        report_interval_s: float = 0.05,
        firmware_version: str = "1.0.0",
    ) -> None:
        self._device = device
        self.node_id = node_id
        self.profile = profile
        self._faults = faults or NodeFaults()
        self._interval = report_interval_s
        self._firmware = firmware_version
        self._slots: list[Slot | None] = [Slot(image, descriptor), None]
        self._active = 0
        self._model: _Model | None = None
        self.receiver = OtaReceiver(profile, public_key, self._active_version, self._faults)
        self._window: deque[float] = deque(
            (float(v) for v in history), maxlen=profile.window_length
        )
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"node-{node_id}", daemon=True)
        self.sent: list[bytes] = []
        self.statuses: list[Status] = []
        self.events: list[str] = []
        self._boot()

    # -- accessors for tests ------------------------------------------------------------------

    @property
    def active_version(self) -> int:
        return self._active_version()

    @property
    def chunks_stored(self) -> int:
        return self.receiver.chunks_stored

    def _active_version(self) -> int:
        with self._lock:
            slot = self._slots[self._active]
            assert slot is not None
            return slot.descriptor.model_version

    def has_working_model(self) -> bool:
        with self._lock:
            slot = self._slots[self._active]
        return slot is not None and self_test(slot.image, self.profile) is not None

    def readings(self) -> list[NodeReading]:
        with self._lock:
            lines = list(self.sent)
        decoded = [decode_line(line) for line in lines if line.startswith(b"R,")]
        return [line for line in decoded if isinstance(line, NodeReading)]

    def status_codes(self) -> list[int]:
        with self._lock:
            return [status.code for status in self.statuses]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.node_id}: condition not met; events {self.events}")
            time.sleep(0.01)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _boot(self) -> None:
        """Load the active slot; if it fails its self-test, fall back to the other slot."""
        for _ in range(2):
            slot = self._slots[self._active]
            if slot is not None and self_test(slot.image, self.profile) is not None:
                self._model = _Model(slot.image, self.profile)
                return
            self.events.append(f"boot_failed:slot{self._active}")
            self._active = 1 - self._active
        raise RuntimeError("no slot holds a working model")  # the firmware would halt here

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        splitter = LineSplitter()
        self._write(self._hello())
        next_report = time.monotonic() + self._interval
        while not self._stop.is_set():
            try:
                data = self._device.read_available(0.01)
            except (RuntimeError, OSError):
                time.sleep(0.01)  # unplugged: wait for the cable
                continue
            for item in splitter.feed(data):
                if not isinstance(item, ReadingRejectedError):
                    self._on_line(item)
            if time.monotonic() >= next_report:
                next_report += self._interval
                self._report()

    def _write(self, line: bytes) -> None:
        try:
            self._device.write(line)
        except (RuntimeError, OSError):
            return  # cable out: the line is lost, as on the board
        with self._lock:
            self.sent.append(line)

    def _hello(self) -> bytes:
        slot = self._slots[self._active]
        assert slot is not None
        return encode_hello(
            self.node_id, self._firmware, slot.descriptor.model_name, slot.descriptor.model_version
        )

    def _report(self) -> None:
        raw = 18.0 + 4.0 * math.sin(self._seq / 7.0)
        self._window.append(raw)
        window = np.asarray(self._window, dtype=np.float64)
        calibrated: dict[str, float] = {}
        version = None
        if (
            self._model is not None
            and len(window) == self.profile.window_length
            and window_is_valid(window, newest_observed=True)
        ):
            calibrated["cal_pm10"] = self._model.calibrate(window.astype(np.float32))
            version = self.active_version
        self._write(
            encode_reading(
                self.node_id,
                self._seq,
                None,
                {"pm10": raw},
                calibrated=calibrated,
                model_version=version,
            )
        )
        self._seq += 1

    def _on_line(self, raw: bytes) -> None:
        try:
            line = decode_line(raw)
        except ReadingRejectedError:
            return  # a corrupted line: the gateway times out and resends
        if isinstance(line, HelloRequest):
            self._write(self._hello())
        elif isinstance(line, OtaFrame):
            self._on_ota(line.fields)

    def _answer(self, status: Status) -> None:
        with self._lock:
            self.statuses.append(status)
        self.events.append(OtaStatus(status.code).name.lower())
        self._write(encode_ota(status))
        if self.receiver.cut_link_now:  # the "USB cable" is pulled right after this answer
            self.receiver.cut_link_now = False
            self.events.append("link_cut")
            self._device.unplug()
            time.sleep(self._faults.cut_link_s)
            self._device.replug()

    def _on_ota(self, fields: tuple[str, ...]) -> None:
        if self._faults.hello_during_first_frame:
            self._faults.hello_during_first_frame = False
            self.events.append("second_hello")
            self._write(self._hello())
            time.sleep(self._faults.slow_first_answer_s)
        status = self.receiver.handle_fields(fields)
        if status is None:
            self._commit()
            return
        self._answer(status)

    def _commit(self) -> None:
        verified = self.receiver.take_verified()
        assert verified is not None
        previous = self._active
        with self._lock:
            self._slots[1 - previous] = Slot(*verified)
            self._active = 1 - previous
        self.events.append("reboot")
        if self._faults.usb_reboot:
            self._device.unplug()
            time.sleep(self._faults.cut_link_s)
            self._device.replug()
        self._boot()  # the previous slot passed its self-test when it booted, so this succeeds
        code = OtaStatus.ACTIVE if self._active != previous else OtaStatus.ROLLED_BACK
        self._answer(Status(code, 0))
        self._write(self._hello())


class OtaReceiver:
    """The node's OTA state machine, pure (no I/O); mirrors firmware/src/ota_receiver.cpp.

    ``handle_fields`` answers every frame with a :class:`Status`, except an accepted commit
    (a verified image): then it returns None and the caller activates the image.
    """

    def __init__(
        self,
        profile: FirmwareProfile,
        public_key: bytes,
        active_version: Callable[[], int],
        faults: NodeFaults | None = None,
    ) -> None:
        self._profile = profile
        self._key = VerifyKey(public_key)
        self._active_version = active_version
        self._faults = faults or NodeFaults()
        self._session: _Session | None = None
        self.chunks_stored = 0
        self.cut_link_now = False

    @property
    def next_seq(self) -> int:
        return self._session.next_seq if self._session is not None else 0

    def take_verified(self) -> tuple[bytes, ImageDescriptor] | None:
        session, self._session = self._session, None
        if session is None or not session.verified:
            return None
        return bytes(session.buffer), session.descriptor

    def handle_fields(self, fields: tuple[str, ...] | list[str]) -> Status | None:
        try:
            message = decode_ota(fields)
        except OtaFrameError as exc:
            return Status(exc.code, self.next_seq)
        return self.handle(message)

    def handle(self, message: OtaMessage) -> Status | None:  # noqa: PLR0911 - one per kind
        if isinstance(message, Begin):
            return self._on_begin(message)
        if isinstance(message, Chunk):
            return self._on_chunk(message)
        if isinstance(message, Finish):
            return self._on_finish()
        if isinstance(message, Commit):
            if self._session is None or not self._session.verified:
                return Status(OtaStatus.NOT_VERIFIED, self.next_seq)
            return None
        if isinstance(message, Abort):
            self._session = None
            return Status(OtaStatus.OK, 0)
        return Status(OtaStatus.BAD_FRAME, self.next_seq)  # a status sent to a node

    def _on_begin(self, begin: Begin) -> Status:
        try:
            self._key.verify(begin.descriptor, begin.signature)
        except BadSignatureError:
            return Status(OtaStatus.BAD_SIGNATURE, 0)
        try:
            descriptor = ImageDescriptor.decode(begin.descriptor)
        except MalformedReleaseError:
            return Status(OtaStatus.BAD_DESCRIPTOR, 0)
        profile = self._profile
        if (
            descriptor.model_name != profile.model_name
            or descriptor.window_length != profile.window_length
            or descriptor.arena_bytes > profile.arena_bytes
        ):
            return Status(OtaStatus.INCOMPATIBLE, 0)
        if descriptor.image_size > profile.slot_bytes or descriptor.image_size == 0:
            return Status(OtaStatus.TOO_LARGE, 0)
        if descriptor.model_version <= self._active_version():
            return Status(OtaStatus.DOWNGRADE, 0)
        session = self._session
        if session is None or session.begin != begin:  # same image and chunking: resume
            self._session = _Session(
                begin=begin,
                descriptor=descriptor,
                total=chunk_count(descriptor.image_size, begin.chunk_size),
                buffer=bytearray(descriptor.image_size),
            )
        return Status(OtaStatus.OK, self.next_seq)

    def _on_chunk(self, chunk: Chunk) -> Status:
        session = self._session
        if session is None:
            return Status(OtaStatus.NO_SESSION, 0)
        if chunk.seq != session.next_seq:
            return Status(OtaStatus.OUT_OF_SEQUENCE, session.next_seq)
        payload = chunk.payload
        if chunk.seq in self._faults.corrupt_chunks:
            self._faults.corrupt_chunks.discard(chunk.seq)
            payload = bytes([payload[0] ^ 0x01]) + payload[1:]
        if crc32(payload) != chunk.crc:
            return Status(OtaStatus.CRC_MISMATCH, session.next_seq)
        size = session.begin.chunk_size
        offset = chunk.seq * size
        expected = min(size, session.descriptor.image_size - offset)
        if len(payload) != expected:
            return Status(OtaStatus.BAD_FRAME, session.next_seq)
        session.buffer[offset : offset + expected] = payload
        session.next_seq += 1
        self.chunks_stored += 1
        if self._faults.cut_link_after_chunk == chunk.seq:
            self._faults.cut_link_after_chunk = None
            self.cut_link_now = True
        return Status(OtaStatus.OK, session.next_seq)

    def _on_finish(self) -> Status:
        session = self._session
        if session is None:
            return Status(OtaStatus.NO_SESSION, 0)
        if session.next_seq < session.total:
            return Status(OtaStatus.INCOMPLETE, session.next_seq)
        if hashlib.sha256(session.buffer).digest() != session.descriptor.image_sha256:
            session.next_seq = 0
            return Status(OtaStatus.SHA_MISMATCH, 0)
        session.verified = True
        return Status(OtaStatus.VERIFIED, session.total)
