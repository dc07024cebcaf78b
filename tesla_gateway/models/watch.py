"""The models in service, one per slot, and their validated hot reload.

A slot is one configured model directory (``[[models]]``); a feature may have several slots
whose models take different input channels (see :mod:`tesla_gateway.models.choice`).

A new model version is found by polling each configured model directory (a cheap ``stat`` of the
manifest and model files) or on demand (SIGHUP, ``tesla-gateway reload``). The candidate goes
through the full :meth:`Calibrator.load` validation before it replaces the running one; if it
fails, the running model keeps serving and the failure is logged and counted.

A model directory may hold slots (tesla_gateway/models/slots.py): ``current`` is tried first, then
``previous``, then the directory's own files. With nothing serving (at start), the first that
loads serves, and a fallback is logged (``model_fallback``) and shown in :meth:`ModelSet.stats`;
when none loads the feature has no model (the gateway runs degraded until one arrives).

Nothing older than what serves replaces it, and, with a record of served versions
(tesla_gateway/models/served.py), nothing older than the version a slot last switched to is
served by a later start either, unless downgrades are allowed (``[ota] allow_downgrade``). The
floor binds directories the daemon can write, where copies come from; a directory it cannot
write changes only by its owner's hand (a package rolled back), as trusted as the daemon's own
files (tesla_gateway/models/trust.py).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from tesla_gateway.contract.time_of_day import is_hour_channel
from tesla_gateway.errors import GatewayError
from tesla_gateway.models.calibrator import Calibrator
from tesla_gateway.models.runtime import DEFAULT_RUNTIME_PREFERENCE, RuntimeName
from tesla_gateway.models.served import ServedVersions
from tesla_gateway.models.slots import Candidate, CandidateLabel, candidates
from tesla_gateway.models.trust import ModelTrust, writable_by_daemon

__all__ = ["ModelRefusedError", "ModelSet", "ReloadOutcome", "ReloadResult"]

_log = structlog.get_logger(__name__)

Fingerprint = tuple[tuple[str, int, int, int], ...]


class ModelRefusedError(GatewayError):
    """A valid model that may not replace the serving one (wrong feature, downgrade)."""


class ReloadOutcome(enum.StrEnum):
    LOADED = "loaded"  # a new version replaced the running one (or the first one loaded)
    UNCHANGED = "unchanged"  # same version and bytes as the one serving
    REJECTED = "rejected"  # the candidate failed validation; the previous model keeps serving


@dataclass(frozen=True, slots=True)
class ReloadResult:
    slot: str
    feature: str
    outcome: ReloadOutcome
    version: int | None = None
    error: str | None = None


@dataclass(slots=True)
class _Slot:
    feature: str
    model_dir: Path
    calibrator: Calibrator | None = None
    fingerprint: Fingerprint | None = None
    loads: int = 0
    rejects: int = 0
    last_error: str | None = None
    serving_from: CandidateLabel | None = None
    fallback: str | None = None  # why the serving model is not the directory's first candidate
    attempted: set[Fingerprint] = field(default_factory=set)


def _fingerprint(model_dir: Path) -> Fingerprint:
    """Each candidate's path, and the size, mtime and inode of every file in it (a replaced
    file or a switched slot changes one)."""
    entries: list[tuple[str, int, int, int]] = []
    for candidate in candidates(model_dir):
        entries.append((f"{candidate.label}:{candidate.path}", 0, 0, 0))
        try:
            paths = sorted(
                p for p in candidate.path.iterdir() if p.is_file() and not p.name.startswith(".")
            )
        except OSError:
            continue
        for path in paths:
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((path.name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return tuple(entries)


class ModelSet:
    """Thread-safe holder of the current calibrator per slot (slot id -> feature, directory).

    ``refresh`` does blocking work (hashing, interpreter creation): call it through
    ``asyncio.to_thread``. Readers call :meth:`get` from the event loop at any time.
    """

    def __init__(
        self,
        model_dirs: Mapping[str, Path],
        runtime_preference: Sequence[RuntimeName] = DEFAULT_RUNTIME_PREFERENCE,
        *,
        num_threads: int | None = None,
        trust: Mapping[str, ModelTrust] | None = None,
        features: Mapping[str, str] | None = None,
        served: ServedVersions | None = None,
        allow_downgrade: bool = False,
    ) -> None:
        """``model_dirs`` and ``trust`` are keyed by slot id; ``features`` gives each slot's
        feature (default: the slot id is the feature, one model per feature); ``served`` keeps
        each slot's floor across restarts (default: none, only what serves now counts);
        ``allow_downgrade`` lets an older model replace a newer one (a deliberate rollback)."""
        named = dict(features or {})
        self._slots = {
            slot: _Slot(feature=named.get(slot, slot), model_dir=path)
            for slot, path in model_dirs.items()
        }
        # Every slot id is its feature (the common case: nothing to choose, nothing to map);
        # read on every reading, so computed once (the slots are fixed).
        self.one_per_feature = all(i == slot.feature for i, slot in self._slots.items())
        self._trust = dict(trust or {})
        self._preference = tuple(runtime_preference)
        self._num_threads = num_threads
        self._served = served if served is not None else ServedVersions(None)
        self._allow_downgrade = allow_downgrade
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()

    @property
    def slot_ids(self) -> tuple[str, ...]:
        return tuple(self._slots)

    @property
    def features(self) -> tuple[str, ...]:
        """The features served, each once, in configuration order."""
        return tuple(dict.fromkeys(slot.feature for slot in self._slots.values()))

    def feature_of(self, slot_id: str) -> str:
        return self._slots[slot_id].feature

    def slots_for(self, feature: str) -> tuple[str, ...]:
        return tuple(i for i, slot in self._slots.items() if slot.feature == feature)

    def model_dir(self, slot_id: str) -> Path | None:
        slot = self._slots.get(slot_id)
        return None if slot is None else slot.model_dir

    def get(self, slot_id: str) -> Calibrator | None:
        with self._lock:
            slot = self._slots.get(slot_id)
            return None if slot is None else slot.calibrator

    def primary(self, feature: str) -> Calibrator | None:
        """The feature's first serving model in configuration order (its grid and error
        figures stand for the feature in monitoring)."""
        with self._lock:
            for slot in self._slots.values():
                if slot.feature == feature and slot.calibrator is not None:
                    return slot.calibrator
        return None

    def release_slot(self, feature: str, channels: Sequence[str]) -> str | None:
        """The slot a release of ``feature`` with these input channels replaces: the one
        serving the same channels, else the one serving the same channels from readings (a
        model that adds or drops the hour of the day), else the feature's only slot, else its
        one empty slot."""
        ids = self.slots_for(feature)
        read = tuple(name for name in channels if not is_hour_channel(name))
        with self._lock:
            serving = [(i, self._slots[i].calibrator) for i in ids]
            for wanted, of in ((tuple(channels), "channels"), (read, "read_channels")):
                for slot_id, calibrator in serving:
                    if calibrator is not None and getattr(calibrator.geometry, of) == wanted:
                        return slot_id
            empty = [i for i in ids if self._slots[i].calibrator is None]
        if len(ids) == 1:
            return ids[0]
        return empty[0] if len(empty) == 1 else None

    def loaded(self) -> dict[str, Calibrator]:
        """Slot id -> serving calibrator."""
        with self._lock:
            return {f: s.calibrator for f, s in self._slots.items() if s.calibrator is not None}

    def missing(self) -> list[str]:
        """Slots with no model serving: the gateway is degraded for them."""
        with self._lock:
            return sorted(f for f, s in self._slots.items() if s.calibrator is None)

    def refresh(self, *, force: bool = False) -> list[ReloadResult]:
        """Load every model whose directory changed (every one when ``force``)."""
        results: list[ReloadResult] = []
        with self._refresh_lock:
            for slot_id, slot in self._slots.items():
                fingerprint = _fingerprint(slot.model_dir)
                if not force and (fingerprint == slot.fingerprint or fingerprint in slot.attempted):
                    continue
                results.append(self._try_load(slot_id, slot, fingerprint))
        return results

    def load_candidate(self, slot_id: str, directory: Path) -> Calibrator:
        """Load ``directory`` as this gateway loads the slot's models (runtime, trust rule)
        without serving it; raise a GatewayError naming what is wrong."""
        candidate = Calibrator.load(
            directory,
            self._preference,
            num_threads=self._num_threads,
            trust=self._trust.get(slot_id),
        )
        self._check_candidate(self._slots[slot_id].feature, None, candidate)
        self._check_siblings(slot_id, candidate)
        return candidate

    def _check_siblings(self, slot_id: str, candidate: Calibrator) -> None:
        """A feature's models publish on one topic: they must share the period grid."""
        feature = self._slots[slot_id].feature
        with self._lock:
            siblings = [
                (other, slot.calibrator)
                for other, slot in self._slots.items()
                if other != slot_id and slot.feature == feature and slot.calibrator is not None
            ]
        for other, sibling in siblings:
            if sibling.geometry.period_seconds != candidate.geometry.period_seconds:
                raise ModelRefusedError(
                    f"{candidate.model_dir} has a {candidate.geometry.period_seconds} s period "
                    f"but {feature}'s model {other} has {sibling.geometry.period_seconds} s; "
                    "the models of one feature must share the period"
                )

    def adopt(self, slot_id: str, calibrator: Calibrator) -> bool:
        """Serve ``calibrator`` (a release just made current); False if it already serves."""
        with self._refresh_lock:
            slot = self._slots[slot_id]
            current = slot.calibrator
            slot.fingerprint = _fingerprint(slot.model_dir)
            slot.attempted.clear()
            slot.last_error = None
            slot.serving_from, slot.fallback = "current", None
            if current is not None and (current.version, current.sha256) == (
                calibrator.version,
                calibrator.sha256,
            ):
                return False
            with self._lock:
                slot.calibrator = calibrator
            slot.loads += 1
            self._served.record(slot_id, slot.model_dir, calibrator.version)
        self._log_loaded(slot_id, slot, calibrator, current, source="release")
        return True

    def _try_load(self, slot_id: str, slot: _Slot, fingerprint: Fingerprint) -> ReloadResult:
        feature = slot.feature
        current = slot.calibrator
        failures: list[tuple[Candidate, GatewayError]] = []
        chosen: tuple[Candidate, Calibrator] | None = None
        for place in candidates(slot.model_dir):
            try:
                candidate = self.load_candidate(slot_id, place.path)
                self._check_candidate(feature, current, candidate)
                self._check_floor(slot_id, candidate)
            except GatewayError as exc:
                failures.append((place, exc))
                _log.error(
                    "model_rejected",
                    feature=feature,
                    slot_id=slot_id,
                    model_dir=str(place.path),
                    slot=place.label,
                    error=str(exc),
                    error_type=type(exc).__name__,
                    serving_version=None if current is None else current.version,
                )
                if current is not None:
                    break  # something serves: keep it rather than fall back past a new model
                continue
            chosen = (place, candidate)
            break
        if chosen is None:
            slot.attempted.add(fingerprint)
            slot.rejects += 1
            slot.last_error = "; ".join(
                str(exc) if len(failures) == 1 else f"{place.label}: {exc}"
                for place, exc in failures
            )
            return ReloadResult(slot_id, feature, ReloadOutcome.REJECTED, error=slot.last_error)
        place, candidate = chosen
        slot.fingerprint = fingerprint
        slot.attempted.clear()
        if failures:
            slot.fallback = "; ".join(f"{p.label}: {exc}" for p, exc in failures)
            _log.error(
                "model_fallback",
                feature=feature,
                slot_id=slot_id,
                serving=place.label,
                model_dir=str(place.path),
                version=candidate.version,
                failed={p.label: str(exc) for p, exc in failures},
            )
        if current is not None and (current.version, current.sha256) == (
            candidate.version,
            candidate.sha256,
        ):
            return ReloadResult(slot_id, feature, ReloadOutcome.UNCHANGED, version=current.version)
        with self._lock:
            slot.calibrator = candidate
        slot.serving_from = place.label
        if not failures:
            slot.fallback = None
        slot.loads += 1
        slot.last_error = None
        self._served.record(slot_id, slot.model_dir, candidate.version)
        self._log_loaded(slot_id, slot, candidate, current, source=place.label)
        return ReloadResult(slot_id, feature, ReloadOutcome.LOADED, version=candidate.version)

    @staticmethod
    def _log_loaded(
        slot_id: str, slot: _Slot, candidate: Calibrator, current: Calibrator | None, source: str
    ) -> None:
        _log.info(
            "model_loaded",
            feature=slot.feature,
            slot_id=slot_id,
            channels=list(candidate.geometry.channels),
            model=candidate.name,
            version=candidate.version,
            previous_version=None if current is None else current.version,
            runtime=candidate.runtime_name,
            runtime_version=candidate.runtime_version,
            model_dir=str(candidate.model_dir),
            slot=source,
            trust=candidate.trust,
        )

    def downgrade_floor(self, slot_id: str) -> int | None:
        """The lowest version a release may bring to ``slot_id`` (None: any), whatever serves
        now: the version the slot last switched to, unless downgrades are allowed."""
        slot = self._slots.get(slot_id)
        if self._allow_downgrade or slot is None:
            return None
        return self._served.floor(slot_id, slot.model_dir)

    def _check_floor(self, slot_id: str, candidate: Calibrator) -> None:
        """Refuse a candidate below the version the slot last switched to (module docstring)."""
        floor = self.downgrade_floor(slot_id)
        if floor is None or candidate.version >= floor:
            return
        if not writable_by_daemon(candidate.model_dir):
            return  # its owner's hand, not a copy: see the module docstring
        raise ModelRefusedError(
            f"{candidate.model_dir} holds version {candidate.version}, older than v{floor} which "
            f"slot {slot_id} has served (recorded in {self._served.path or 'memory'}); a start "
            "never goes back: install a higher version, or set [ota] allow_downgrade = true "
            "for a deliberate rollback"
        )

    def _check_candidate(
        self, feature: str, current: Calibrator | None, candidate: Calibrator
    ) -> None:
        if candidate.feature != feature:
            raise ModelRefusedError(
                f"{candidate.model_dir} holds a {candidate.feature} model but is configured "
                f"for {feature}"
            )
        if current is None:
            return
        if candidate.version < current.version and not self._allow_downgrade:
            raise ModelRefusedError(
                f"{candidate.model_dir} holds version {candidate.version}, older than the "
                f"serving version {current.version}; a release must carry a larger version"
            )
        if candidate.version == current.version and candidate.sha256 != current.sha256:
            raise ModelRefusedError(
                f"{candidate.model_dir} holds different bytes under the serving version "
                f"{current.version}; bump the version for a new release"
            )

    def stats(self) -> dict[str, dict[str, object]]:
        """Per slot: feature, serving model, channels, version, runtime, reload counters."""
        with self._lock:
            return {
                slot_id: {
                    "feature": slot.feature,
                    "model": None if slot.calibrator is None else slot.calibrator.name,
                    "channels": None
                    if slot.calibrator is None
                    else list(slot.calibrator.geometry.channels),
                    "version": None if slot.calibrator is None else slot.calibrator.version,
                    "runtime": None if slot.calibrator is None else slot.calibrator.runtime_name,
                    "model_dir": str(slot.model_dir),
                    "reloads": slot.loads,
                    "rejected": slot.rejects,
                    "last_error": slot.last_error,
                    "slot": None if slot.calibrator is None else slot.serving_from,
                    "fallback": slot.fallback,
                }
                for slot_id, slot in self._slots.items()
            }
