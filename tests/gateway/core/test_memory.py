"""The mmap threshold pin: a freed large array goes back to the system."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.daemon.memory import pin_mmap_threshold, release_free_heap


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_large_arrays_do_not_stay_resident() -> None:
    assert pin_mmap_threshold()
    first = np.ones(3_000_000)  # 24 MB: without the pin, glibc would raise its threshold here
    del first
    before = _resident_bytes()
    second = np.ones(2_000_000)  # 16 MB, below the raised threshold: would come from the heap
    del second
    assert _resident_bytes() - before < 4 * 2**20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_free_heap_is_released() -> None:
    assert release_free_heap()
