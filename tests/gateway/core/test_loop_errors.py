"""The event loop's exception handler (tesla_gateway/daemon/loop_errors.py, issue 26 item 12): a
file descriptor shortage is one JSON warning per interval with a count, never a traceback per
failed accept; anything else still reaches asyncio's default handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import subprocess
import sys
import textwrap
import time

import pytest
from structlog.testing import capture_logs

from tesla_gateway.daemon.loop_errors import LoopErrorReporter

ACCEPT_FAILED = "socket.accept() out of system resource"
# Of the listener below at most (the flood, the closes, the retried accepts, a last echo); it
# ends as soon as the test closes its stdin.
LIFETIME_S = 8


def test_a_thousand_shortages_are_two_warnings_a_minute_apart() -> None:
    now = [0.0]
    reporter = LoopErrorReporter(interval_s=60, clock=lambda: now[0])

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(reporter)
        shortage = OSError(errno.EMFILE, "Too many open files")
        for n in range(1000):
            if n == 999:
                now[0] = 61.0
            loop.call_exception_handler({"message": ACCEPT_FAILED, "exception": shortage})

    with capture_logs() as logs:
        asyncio.run(scenario())
    assert [(e["event"], e["occurrences"], e["total"]) for e in logs] == [
        ("fd_shortage", 1, 1),
        ("fd_shortage", 999, 1000),
    ]
    assert logs[0]["what"] == ACCEPT_FAILED and logs[0]["error"] == "EMFILE"
    assert logs[0]["fd_limit"] > 0 and logs[0]["open_fds"] > 0
    assert reporter.shortages == 1000


def test_other_errors_go_to_the_default_handler(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(LoopErrorReporter())
        loop.call_exception_handler({"message": "a bug", "exception": ValueError("bug")})
        loop.call_exception_handler(
            {"message": "not a shortage", "exception": OSError(errno.EPIPE, "Broken pipe")}
        )

    with capture_logs() as logs:
        asyncio.run(scenario())
    assert logs == []
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert messages == ["a bug", "not a shortage"]


# A listener under a descriptor limit it reaches: the test connects until accept() fails.
_SERVER = textwrap.dedent(
    """
    import asyncio, os, resource, sys
    from tesla_gateway.daemon.logging import configure_logging
    from tesla_gateway.daemon.loop_errors import reporting_loop_errors

    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
        def data_received(self, data):
            self.transport.write(data)

    async def main():
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        in_use = len(os.listdir("/proc/self/fd"))
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 8, hard))
        print(server.sockets[0].getsockname()[1], flush=True)
        # until the test closes stdin (it is done), at most the lifetime
        done = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await asyncio.wait({done}, timeout=float(sys.argv[1]))

    configure_logging("json", "info")
    asyncio.run(reporting_loop_errors(main()))
    """
)


def test_a_listener_out_of_descriptors_logs_one_json_warning_and_recovers() -> None:
    async def flood_then_talk(port: int) -> bool:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(16)]
        await asyncio.sleep(1.5)  # asyncio retries accept() each second, failing each time
        for _, writer in held:
            writer.close()
        await asyncio.sleep(1.5)  # the server closes its side; accept() is retried
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"ping")
            return await asyncio.wait_for(reader.read(4), 5) == b"ping"
        finally:
            writer.close()

    process = subprocess.Popen(  # our interpreter, a literal script
        [sys.executable, "-c", _SERVER, str(LIFETIME_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        assert first, process.stderr.read().decode()
        port = int(first)
        started = time.monotonic()
        served_after = asyncio.run(flood_then_talk(port))
        _, stderr = process.communicate(timeout=LIFETIME_S + 30 - (time.monotonic() - started))
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    lines = stderr.decode().splitlines()
    events = [json.loads(line) for line in lines]  # every line is JSON: no traceback text
    shortages = [e for e in events if e["event"] == "fd_shortage"]
    print(f"{len(lines)} stderr lines; fd_shortage: {shortages}")
    assert process.returncode == 0
    assert len(shortages) == 1, "one warning per minute, however many accepts failed"
    assert (shortages[0]["what"], shortages[0]["error"]) == (ACCEPT_FAILED, "EMFILE")
    assert served_after, "the listener accepts again once descriptors are free"
    assert all(e["level"] != "error" for e in events)
