"""A model directory's slots: the model to serve, the one before it, and atomic switches.

Layout (docs/deployment.md, "Model slots")::

    <model_dir>/current  -> slots/<slot>    the model to serve (a relative symlink)
    <model_dir>/previous -> slots/<slot>    the model that served before the last switch
    <model_dir>/slots/<slot>/               manifest.json, FlatBuffers, release.json, golden.json
    <model_dir>/slots/.staging-*/           a release being written: never read, pruned

A release is written into a new slot beside the serving one and becomes current by one
rename(2) of a new symlink over ``current``, so a reader, a SIGKILL or a power cut sees the
old slot or the new one, never a mix of files. A directory without slots that holds a manifest
itself (the read-only default models, installs made before slots) is served as it is, after
the slots.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tesla_gateway.contract.manifest import MANIFEST_FILENAME

__all__ = [
    "CURRENT",
    "PREVIOUS",
    "SLOTS",
    "Candidate",
    "CandidateLabel",
    "ModelSlots",
    "candidates",
]

CURRENT = "current"
PREVIOUS = "previous"
SLOTS = "slots"
_STAGING_PREFIX = ".staging-"
_SLOT_NAME = re.compile(r"^v[0-9]{1,10}-[0-9a-f]{8}$")

CandidateLabel = Literal["current", "previous", "directory"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One place a model may be served from, in the order they are tried."""

    label: CandidateLabel
    path: Path


def _slot_of(model_dir: Path, link_name: str) -> Path | None:
    """The slot a link names (``slots/<name>``), or None when there is no such link.

    A link an operator pointed elsewhere is returned as the link itself: it is tried like any
    candidate (sha256 and trust rule included) and, if it is no model, fails with a message
    rather than being skipped silently. Installs never write such links and never prune there.
    """
    link = model_dir / link_name
    try:
        text = link.readlink()
    except OSError:
        return None
    parts = text.parts
    if len(parts) == 2 and parts[0] == SLOTS and _SLOT_NAME.fullmatch(parts[1]):
        return model_dir / SLOTS / parts[1]
    return link


def candidates(model_dir: Path) -> list[Candidate]:
    """``current``, then ``previous``, then the directory's own files (if any, or if no slot)."""
    found: list[Candidate] = []
    for label, name in (("current", CURRENT), ("previous", PREVIOUS)):
        slot = _slot_of(model_dir, name)
        if slot is not None and slot not in [c.path for c in found]:
            found.append(Candidate(label, slot))  # type: ignore[arg-type]
    if not found or (model_dir / MANIFEST_FILENAME).exists():
        found.append(Candidate("directory", model_dir))
    return found


def _fsync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class ModelSlots:
    """Writes slots into one model directory (one installer at a time: the OTA service)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.slots_dir = model_dir / SLOTS

    def current(self) -> Path | None:
        return _slot_of(self.model_dir, CURRENT)

    def previous(self) -> Path | None:
        return _slot_of(self.model_dir, PREVIOUS)

    def stage(self, version: int, files: Mapping[str, bytes]) -> Path:
        """Write ``files`` into a new slot (fsynced) that nothing points to yet."""
        self.slots_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self.slots_dir, prefix=_STAGING_PREFIX))
        for name, data in files.items():
            with (staging / name).open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            (staging / name).chmod(0o644)
        staging.chmod(0o755)
        _fsync_directory(staging)
        slot = self.slots_dir / f"v{version}-{secrets.token_hex(4)}"
        staging.rename(slot)
        _fsync_directory(self.slots_dir)
        return slot

    def commit(self, slot: Path, *, keep: Path | None = None) -> None:
        """Make ``slot`` current in one rename; ``previous`` becomes ``keep`` (the serving
        model, when it is a slot here) or else the slot that was current."""
        old = self.current()
        if keep is not None and keep.parent == self.slots_dir and keep.is_dir():
            old = keep
        if old is not None and old.parent == self.slots_dir and old != slot:
            self._point(PREVIOUS, old)
        self._point(CURRENT, slot)
        _fsync_directory(self.model_dir)

    def _point(self, name: str, slot: Path) -> None:
        temp = self.model_dir / f".{name}.{secrets.token_hex(4)}.tmp"
        temp.symlink_to(f"{SLOTS}/{slot.name}")
        try:
            temp.replace(self.model_dir / name)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    def discard(self, slot: Path) -> None:
        """Remove a slot that never became current or previous."""
        if slot not in (self.current(), self.previous()):
            shutil.rmtree(slot, ignore_errors=True)

    def prune(self) -> list[str]:
        """Remove every slot other than ``current`` and ``previous``, and leftover temp files
        of interrupted installs; returns what was removed."""
        keep = {self.current(), self.previous()}
        removed: list[str] = []
        try:
            entries = list(self.slots_dir.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            if entry not in keep:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        for temp in self.model_dir.glob(".*.tmp"):
            if temp.is_symlink():
                temp.unlink(missing_ok=True)
                removed.append(temp.name)
        return removed
