"""Relay node releases over the serial line to every attached node that runs an older model.

One worker per node port wakes on each hello (the node boots, reconnects or finished an update)
and on each new release. If the node runs an older version of the release's model, the worker
moves the image with the protocol of docs/ota-protocol.md: stop-and-wait, one status per frame,
retransmission from the node's own ``next_seq`` after a CRC error or a timeout, and resumption
after a broken link (the node keeps what it received and reports it at the next handshake).
Every step is reported as a :class:`NodeUpdateStatus` (pending, transferring n/m, verified,
active, rejected: reason, rolled back).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.ota.errors import OtaFrameError
from tesla_gateway.ota.protocol import (
    Begin,
    Chunk,
    Commit,
    Finish,
    OtaMessage,
    OtaStatus,
    Status,
    chunk_count,
    decode_ota,
    encode_ota,
    status_message,
)
from tesla_gateway.ota.release import VerifiedRelease
from tesla_gateway.sources.line_protocol import Hello, OtaFrame
from tesla_gateway.sources.serial_source import NodeLink, SerialLinkDownError

__all__ = ["NodeRelay", "NodeUpdateStatus"]

_log = structlog.get_logger(__name__)

# Codes that mean "this release will never work on this node": do not offer it again.
_PERMANENT = frozenset(
    {
        OtaStatus.BAD_SIGNATURE,
        OtaStatus.DOWNGRADE,
        OtaStatus.INCOMPATIBLE,
        OtaStatus.TOO_LARGE,
        OtaStatus.BAD_DESCRIPTOR,
        OtaStatus.UNSUPPORTED_VERSION,
        OtaStatus.BAD_MAGIC,
    }
)
_POLL_S = 0.1  # how often a pending frame checks that the link and the node are still there
_RESEND = frozenset({OtaStatus.CRC_MISMATCH, OtaStatus.OUT_OF_SEQUENCE, OtaStatus.INCOMPLETE})
# What a node can answer to each frame (docs/ota-protocol.md section 5); anything else is the
# late answer to an earlier frame. BAD_FRAME and FLASH_ERROR can answer any frame.
_ANY_FRAME = frozenset({OtaStatus.BAD_FRAME, OtaStatus.FLASH_ERROR})
_BEGIN_ANSWERS = _ANY_FRAME | _PERMANENT | {OtaStatus.OK}
_CHUNK_ERRORS = _ANY_FRAME | {
    OtaStatus.CRC_MISMATCH,
    OtaStatus.OUT_OF_SEQUENCE,
    OtaStatus.NO_SESSION,
}
_FINISH_ANSWERS = _ANY_FRAME | {
    OtaStatus.VERIFIED,
    OtaStatus.INCOMPLETE,
    OtaStatus.SHA_MISMATCH,
    OtaStatus.NO_SESSION,
    OtaStatus.BAD_SIGNATURE,
}
_COMMIT_ANSWERS = _ANY_FRAME | {
    OtaStatus.ACTIVE,
    OtaStatus.ROLLED_BACK,
    OtaStatus.NOT_VERIFIED,
    OtaStatus.NO_SESSION,
}


def _answers(message: OtaMessage, status: Status) -> bool:
    """Whether ``status`` can be the node's answer to ``message`` (not one to an earlier frame).

    A chunk's ``ok`` names the chunk after it, which tells a stale ``ok`` (to the handshake or
    an earlier chunk) from the real one.
    """
    code = status.code
    if isinstance(message, Begin):
        return code in _BEGIN_ANSWERS
    if isinstance(message, Chunk):
        if code == OtaStatus.OK:
            return status.next_seq == message.seq + 1
        return code in _CHUNK_ERRORS
    if isinstance(message, Finish):
        return code in _FINISH_ANSWERS
    if isinstance(message, Commit):
        return code in _COMMIT_ANSWERS
    return True


@dataclass(frozen=True, slots=True)
class NodeUpdateStatus:
    """One step of one node's update, as published on MQTT."""

    node_id: str
    model: str
    version: int
    status: str  # pending | transferring n/m | verified | active | rejected: … | rolled back
    detail: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "model": self.model,
            "version": self.version,
            "status": self.status,
            "detail": self.detail,
        }


class _LinkLostError(Exception):
    """The node's port went away mid-update; resume at the next hello."""


class _GiveUpError(Exception):
    """The node answered with an error that ends this attempt."""

    def __init__(self, code: int | None, detail: str, *, permanent: bool) -> None:
        super().__init__(detail)
        self.code = code
        self.permanent = permanent


class NodeRelay:
    """Owns one update worker per node port; ``run`` until cancelled."""

    def __init__(
        self,
        links: Mapping[str, NodeLink],
        config: OtaConfig,
        on_status: Callable[[NodeUpdateStatus], None],
    ) -> None:
        self._config = config
        self._on_status = on_status
        self._releases: dict[str, VerifiedRelease] = {}
        self._workers = [_NodeWorker(link, self) for link in links.values()]
        self.last_status: dict[str, NodeUpdateStatus] = {}

    def offer(self, release: VerifiedRelease) -> None:
        """Make ``release`` (verified, target node) the one nodes of its model should run."""
        current = self._releases.get(release.metadata.model)
        if current is not None and current.version >= release.version:
            return
        self._releases[release.metadata.model] = release
        _log.info("node_release_offered", model=release.metadata.model, version=release.version)
        for worker in self._workers:
            worker.wake()

    def candidate(
        self, hello: Hello, refused: set[tuple[str, int]], known_version: int | None = None
    ) -> VerifiedRelease | None:
        """The release this node should get, if any (``known_version``: what it just activated)."""
        running = max(
            (v for v in (hello.model_version, known_version) if v is not None), default=None
        )
        for name, release in self._releases.items():
            if hello.model_name is not None and hello.model_name != name:
                continue
            if running is not None and release.version <= running:
                continue
            if (name, release.version) in refused:
                continue
            return release
        return None

    def report(self, status: NodeUpdateStatus) -> None:
        self.last_status[status.node_id] = status
        self._on_status(status)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for worker in self._workers:
                group.create_task(worker.run(), name=f"ota-relay:{worker.port}")


class _NodeWorker:
    def __init__(self, link: NodeLink, relay: NodeRelay) -> None:
        self._link = link
        self._relay = relay
        self._config = relay._config
        self._statuses: asyncio.Queue[Status] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._refused: set[tuple[str, int]] = set()
        self._activated: int | None = None  # version committed since the last hello
        self._committing: VerifiedRelease | None = None  # commit sent, outcome not yet known
        self._hellos = 0
        # A frame abandoned on a hello may still be answered: wait this long for that answer
        # before the next frame (loop time), so it is not taken for the next frame's.
        self._stale_answer_until: float | None = None
        self.port = str(link.port)
        link.ota_handler = self._on_frame
        link.hello_handler = self._on_hello

    def wake(self) -> None:
        self._wake.set()

    def _on_frame(self, frame: OtaFrame) -> None:
        try:
            message = decode_ota(frame.fields)
        except OtaFrameError as exc:
            _log.warning("ota_frame_invalid", port=self.port, error=str(exc))
            return
        if isinstance(message, Status):
            self._statuses.put_nowait(message)
        else:
            _log.warning("ota_frame_unexpected", port=self.port, kind=type(message).__name__)

    def _on_hello(self, _hello: Hello) -> None:
        self._activated = None  # the hello itself now says what runs
        self._hellos += 1
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            hello = self._link.hello
            if hello is None:
                continue
            if self._committing is not None:
                self._settle_commit(hello, self._committing)
            release = self._relay.candidate(hello, self._refused, self._activated)
            if release is None:
                continue
            try:
                await self._update(hello, release)
            except _LinkLostError as exc:
                _log.info("ota_link_lost", node_id=hello.node_id, detail=str(exc))
            except _GiveUpError as exc:
                if exc.permanent:
                    self._refused.add((release.metadata.model, release.version))
                reason = status_message(exc.code) if exc.code is not None else str(exc)
                self._report(hello, release, f"rejected: {reason}", str(exc))

    def _report(
        self, hello: Hello, release: VerifiedRelease, status: str, detail: str | None = None
    ) -> None:
        self._relay.report(
            NodeUpdateStatus(
                node_id=hello.node_id,
                model=release.metadata.model,
                version=release.version,
                status=status,
                detail=detail,
            )
        )

    async def _send(self, message: OtaMessage) -> None:
        try:
            await self._link.send_line(encode_ota(message))
        except SerialLinkDownError as exc:
            raise _LinkLostError(str(exc)) from exc

    async def _exchange(self, message: OtaMessage, timeout_s: float) -> Status | None:
        """Send one frame and wait for the node's status (None after a timeout).

        Statuses that cannot answer ``message`` are late answers to earlier frames and are
        dropped. Raises :class:`_LinkLostError` as soon as the port closes or the node says
        hello again (it restarted): waiting out the timeout would only delay the resumption.
        """
        await self._drop_stale_answers()
        hellos = self._hellos
        await self._send(message)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                # asyncio.timeout, not wait_for (banned in pyproject.toml: it can swallow a cancel)
                async with asyncio.timeout(min(remaining, _POLL_S)):
                    status = await self._statuses.get()
            except TimeoutError:
                if not self._link.connected:
                    raise _LinkLostError("port closed while waiting for the node") from None
                if self._hellos != hellos:
                    # The hello may only be the answer to our hello request, read after this
                    # frame: the node may still answer the frame.
                    self._stale_answer_until = deadline
                    raise _LinkLostError("the node restarted while the frame was pending") from None
                continue
            if _answers(message, status):
                return status
            _log.info(
                "ota_stale_answer_dropped",
                port=self.port,
                frame=type(message).__name__,
                code=status.code,
                next_seq=status.next_seq,
            )

    async def _drop_stale_answers(self) -> None:
        """Forget answers to earlier frames, waiting for one still owed to an abandoned frame."""
        until, self._stale_answer_until = self._stale_answer_until, None
        if until is not None and self._statuses.empty() and self._link.connected:
            remaining = until - asyncio.get_running_loop().time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        stale = await self._statuses.get()
                    _log.info("ota_stale_answer_dropped", port=self.port, code=stale.code)
        while not self._statuses.empty():  # answers to earlier, timed-out frames
            self._statuses.get_nowait()

    async def _begin(self, begin: Begin) -> int:
        """Handshake (also used to resynchronise); returns the node's next_seq."""
        for _ in range(self._config.max_retries):
            status = await self._exchange(begin, self._config.ack_timeout_s)
            if status is None:
                continue
            if status.code == OtaStatus.OK:
                return status.next_seq
            raise _GiveUpError(
                status.code,
                f"node refused the handshake: {status.message}",
                permanent=status.code in _PERMANENT,
            )
        raise _LinkLostError("no answer to the handshake")

    async def _update(self, hello: Hello, release: VerifiedRelease) -> None:
        begin = Begin(
            chunk_size=self._config.chunk_size,
            descriptor=release.descriptor,
            signature=release.descriptor_signature,
        )
        self._report(hello, release, "pending")
        _log.info("ota_update_start", node_id=hello.node_id, version=release.version)
        next_seq = await self._begin(begin)
        failures = 0
        while True:
            await self._send_chunks(hello, release, begin, next_seq)
            status = await self._exchange(Finish(), self._config.ack_timeout_s)
            if status is None:
                next_seq = await self._begin(begin)
                continue
            if status.code == OtaStatus.VERIFIED:
                break
            failures += 1
            retry = _RESEND | {OtaStatus.SHA_MISMATCH}
            if status.code not in retry or failures > self._config.max_retries:
                raise _GiveUpError(
                    status.code, status.message, permanent=status.code == OtaStatus.BAD_SIGNATURE
                )
            next_seq = status.next_seq
        self._report(hello, release, "verified")
        await self._commit(hello, release)

    async def _send_chunks(
        self, hello: Hello, release: VerifiedRelease, begin: Begin, next_seq: int
    ) -> None:
        """Stop-and-wait from ``next_seq`` until the node holds every chunk."""
        image = release.node_image
        size = begin.chunk_size
        total = chunk_count(len(image), size)
        step = max(1, total // 10)
        failures = 0
        while next_seq < total:
            if next_seq % step == 0:
                self._report(hello, release, f"transferring {next_seq}/{total}")
            part = image[next_seq * size : (next_seq + 1) * size]
            status = await self._exchange(Chunk(next_seq, part), self._config.ack_timeout_s)
            if status is not None and status.code == OtaStatus.OK:
                next_seq = status.next_seq
                failures = 0
                continue
            failures += 1
            if failures > self._config.max_retries:
                raise _GiveUpError(None, "too many retransmissions", permanent=False)
            if status is None or status.code == OtaStatus.NO_SESSION:
                next_seq = await self._begin(begin)  # resynchronise: the node says where
            elif status.code in _RESEND:
                _log.info("ota_chunk_resend", node_id=hello.node_id, seq=status.next_seq)
                next_seq = status.next_seq
            else:
                raise _GiveUpError(status.code, status.message, permanent=False)
        self._report(hello, release, f"transferring {total}/{total}")

    def _settle_commit(self, hello: Hello, release: VerifiedRelease) -> None:
        """A board reboots on commit (its USB port drops): its next hello tells the outcome."""
        self._committing = None
        if hello.model_version == release.version:
            self._report(hello, release, "active")
        else:
            self._refused.add((release.metadata.model, release.version))
            self._report(hello, release, "rolled back", f"node runs v{hello.model_version}")

    async def _commit(self, hello: Hello, release: VerifiedRelease) -> None:
        self._committing = release
        status = await self._exchange(Commit(), self._config.commit_timeout_s)
        if status is None:
            raise _LinkLostError("no answer to commit; the node's next hello tells the outcome")
        self._committing = None
        if status.code == OtaStatus.ACTIVE:
            self._activated = release.version  # until its next hello, which may lag
            self._report(hello, release, "active")
            _log.info("ota_update_active", node_id=hello.node_id, version=release.version)
        elif status.code == OtaStatus.ROLLED_BACK:
            self._refused.add((release.metadata.model, release.version))
            self._report(hello, release, "rolled back", status.message)
            _log.warning("ota_update_rolled_back", node_id=hello.node_id, version=release.version)
        else:
            raise _GiveUpError(status.code, status.message, permanent=False)
