"""One daemon per state directory, even when the directory cannot be written.

The pid file (``state_dir/gateway.pid``) tells ``tesla-gateway status`` and ``reload`` which
process runs; it cannot be the guard, because a full or read-only disk refuses it and the
daemon must still start (and calibrate) there. The guard is an exclusive ``flock`` on the state
directory itself: it needs no write access and no free space, and the kernel drops it when the
process dies, so a stale lock cannot exist. A pid file that cannot be written is a warning
(reported on stats and in the systemd status), never a reason to exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from pathlib import Path

import structlog

from tesla_gateway.errors import GatewayError

__all__ = ["AlreadyRunningError", "InstanceLock", "read_pid_file"]

_log = structlog.get_logger(__name__)


class AlreadyRunningError(GatewayError):
    """Another gateway process holds the pid file of this state directory."""


def read_pid_file(path: Path) -> int | None:
    """The pid recorded in ``path`` if that process is alive, else None."""
    try:
        pid = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, owned by someone else
    try:  # after a crash and a reboot the pid may belong to an unrelated process
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return pid  # no /proc: trust the pid
    return pid if _is_gateway_command(args) else None


def _is_gateway_command(args: list[str]) -> bool:
    """``tesla-gateway run ...`` or ``python -m tesla_gateway run ...``."""
    if "run" not in args:
        return False
    if any(Path(arg).name == "tesla-gateway" for arg in args[:3]):
        return True
    return any(a == "-m" and b == "tesla_gateway" for a, b in itertools.pairwise(args))


class InstanceLock:
    """The state directory's lock and pid file; :meth:`claim` at start, :meth:`release` at exit."""

    def __init__(self, state_dir: Path, pid_file: Path) -> None:
        self.state_dir = state_dir
        self.pid_file = pid_file
        self._fd: int | None = None
        self.pid_file_error: str | None = None  # why the pid file could not be written
        self.lock_error: str | None = None  # why the directory could not be locked

    @property
    def problems(self) -> list[str]:
        """What is degraded, for the status line and stats (empty when all is well)."""
        return [p for p in (self.lock_error, self.pid_file_error) if p is not None]

    def claim(self, other_pid: int | None) -> None:
        """Lock the directory and record our pid; raise if another gateway holds either.

        ``other_pid`` is the live gateway named by an existing pid file (an older version of
        the daemon that does not lock), if any.
        """
        if other_pid is not None and other_pid != os.getpid():
            raise AlreadyRunningError(
                f"a gateway (pid {other_pid}) already runs with state_dir {self.state_dir}; "
                "stop it first or give this one its own state_dir"
            )
        self._lock_directory()
        self._write_pid_file()

    def _lock_directory(self) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _log.warning("state_dir_not_created", path=str(self.state_dir), error=str(exc))
        try:
            fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            self.lock_error = f"state_dir {self.state_dir} cannot be locked: {exc.strerror or exc}"
            _log.warning("single_instance_unguarded", error=self.lock_error)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunningError(
                f"another gateway holds the lock on state_dir {self.state_dir}; "
                "stop it first or give this one its own state_dir"
            ) from None
        except OSError as exc:  # a file system without flock: run, and say so
            os.close(fd)
            self.lock_error = f"state_dir {self.state_dir} cannot be locked: {exc.strerror or exc}"
            _log.warning("single_instance_unguarded", error=self.lock_error)
            return
        self._fd = fd

    def _write_pid_file(self) -> None:
        temp = self.pid_file.with_name(f".{self.pid_file.name}.tmp")
        try:
            temp.write_text(f"{os.getpid()}\n", encoding="ascii")
            temp.replace(self.pid_file)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
            self.pid_file_error = f"pid file {self.pid_file} not written: {exc.strerror or exc}"
            _log.warning(
                "pid_file_not_written",
                path=str(self.pid_file),
                error=exc.strerror or str(exc),
                detail="the daemon runs; 'tesla-gateway reload' cannot find it until restart",
            )
            return
        self.pid_file_error = None

    def release(self) -> None:
        """Remove our pid file (if it is ours) and drop the lock."""
        if self.pid_file_error is None:
            try:
                self.pid_file.unlink(missing_ok=True)
            except OSError as exc:
                _log.warning("pid_file_not_removed", path=str(self.pid_file), error=str(exc))
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
