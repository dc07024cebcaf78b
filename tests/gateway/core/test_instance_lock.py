"""One daemon per state directory, with or without a writable pid file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tesla_gateway.daemon.instance_lock import AlreadyRunningError, InstanceLock


def test_a_second_claim_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first = InstanceLock(tmp_path / "state", tmp_path / "state" / "gateway.pid")
    first.claim(None)
    assert (tmp_path / "state" / "gateway.pid").read_text() == f"{os.getpid()}\n"
    second = InstanceLock(tmp_path / "state", tmp_path / "state" / "gateway.pid")
    with pytest.raises(AlreadyRunningError, match="holds the lock"):
        second.claim(None)
    first.release()
    assert not (tmp_path / "state" / "gateway.pid").exists()
    second.claim(None)  # the lock went with the first holder
    second.release()


def test_a_live_gateway_named_by_the_pid_file_is_refused(tmp_path: Path) -> None:
    lock = InstanceLock(tmp_path, tmp_path / "gateway.pid")
    with pytest.raises(AlreadyRunningError, match=r"pid 1\)"):
        lock.claim(1)


def test_an_unwritable_pid_file_is_a_reported_problem_not_an_error(tmp_path: Path) -> None:
    # A directory where the pid file should be: the write fails with a real OSError even as
    # root (permission bits would not stop root), as on a full or read-only state dir.
    (tmp_path / "gateway.pid").mkdir()
    lock = InstanceLock(tmp_path, tmp_path / "gateway.pid")
    lock.claim(None)
    assert lock.problems and "pid file" in lock.problems[0]
    with pytest.raises(AlreadyRunningError):  # still the only instance: the lock holds
        InstanceLock(tmp_path, tmp_path / "gateway.pid").claim(None)
    lock.release()
    assert (tmp_path / "gateway.pid").is_dir()  # not ours: left alone


def test_a_state_dir_that_cannot_exist_runs_unguarded_and_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    lock = InstanceLock(blocker / "state", blocker / "state" / "gateway.pid")
    lock.claim(None)
    assert len(lock.problems) == 2  # no lock, no pid file; both reported
    lock.release()
