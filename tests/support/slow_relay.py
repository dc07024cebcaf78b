"""A loopback TCP relay in front of a real broker that hands the broker's bytes on late.

A broker on loopback answers CONNECT within a millisecond, so a daemon stopped during its
start-up almost never finds a connection waiting for its CONNACK. Through this relay every
chunk the broker sends (the CONNACK first) reaches the client ``delay_s`` after it arrived, in
order; what the client sends goes through at once. The relay runs its own event loop in a
thread, so a synchronous test (the daemon is a child process) can use it with ``with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from devkit.lifecycle import StartStop

__all__ = ["SlowRelay"]

_CHUNK = 65_536
_START_TIMEOUT_S = 10.0


class SlowRelay(StartStop):
    """``with SlowRelay(host, port, delay_s) as relay``: clients connect to ``relay.port``."""

    def __init__(self, broker_host: str, broker_port: int, delay_s: float) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self._broker = (broker_host, broker_port)
        self._delay_s = delay_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._listening.clear()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        if not self._listening.wait(_START_TIMEOUT_S):
            raise TimeoutError("the slow relay did not listen in time")

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        thread.join(_START_TIMEOUT_S)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        links: set[asyncio.Task[None]] = set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            links.add(task)
            try:
                await self._relay(reader, writer)
            finally:
                links.discard(task)

        server = await asyncio.start_server(accepted, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._listening.set()
        async with server:
            await self._stopped.wait()
            for task in list(links):
                task.cancel()
            await asyncio.gather(*links, return_exceptions=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection(*self._broker)
        except OSError:
            client_w.close()
            return
        legs = [
            asyncio.create_task(_copy(client_r, broker_w, 0.0)),
            asyncio.create_task(_copy(broker_r, client_w, self._delay_s)),
        ]
        try:
            await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for leg in legs:
                leg.cancel()
            await asyncio.gather(*legs, return_exceptions=True)
            for writer in (client_w, broker_w):
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy until the end of the stream, each chunk written ``delay_s`` after it was read."""
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, chunk = await due.get()
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            if not chunk:
                return
            writer.write(chunk)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(_CHUNK):
                due.put_nowait((time.monotonic() + delay_s, chunk))
        due.put_nowait((time.monotonic() + delay_s, b""))
        with contextlib.suppress(OSError):
            await delivering
    finally:
        delivering.cancel()
