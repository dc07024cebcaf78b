"""Which modules hold the promises mutation testing checks, and which tests guard each.

Each target is one mutmut session: its modules are mutated and every mutant runs only the tests,
out of the target's own test files, that execute the function it changes (mutmut's per-function
selection). The test files are the unit-level ones; the slower end-to-end suites would multiply
the run time without guarding anything these do not.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TARGETS", "Target", "target_named"]


@dataclass(frozen=True)
class Target:
    """A group of modules with one job and the test files that hold its promises."""

    name: str
    modules: tuple[str, ...]  # paths from the checkout's root
    tests: tuple[str, ...]
    # Functions that run when their module is imported (mutmut's names without the mutant
    # number): mutmut's workers import the modules before a mutant is set, so their mutants
    # are checked again in a fresh process each (session.recheck_at_import).
    import_time: tuple[str, ...] = ()

    @property
    def package(self) -> str:
        """The top-level directory mutmut copies and mutates (tesla_gateway or training)."""
        packages = {module.split("/", 1)[0] for module in self.modules}
        if len(packages) != 1:
            raise ValueError(f"target {self.name} spans packages {sorted(packages)}")
        return packages.pop()


_CORE = "tests/gateway/core"
_IO = "tests/gateway/io"
_OTA = "tests/gateway/ota"
_WINDOW_TESTS = (
    f"{_CORE}/test_window_store.py",
    f"{_CORE}/test_state.py",
    f"{_CORE}/test_clock_sanity.py",
    f"{_CORE}/test_partial_history.py",  # pad_history, and the readout's padded young windows
)

TARGETS: tuple[Target, ...] = (
    Target(
        "series",
        ("tesla_gateway/contract/series.py",),
        (*_WINDOW_TESTS, "tests/training/data/test_windows.py"),
    ),
    Target(
        "window store",
        (
            "tesla_gateway/windows/ring.py",
            "tesla_gateway/windows/seen.py",
            "tesla_gateway/windows/readout.py",
            "tesla_gateway/windows/state.py",
            "tesla_gateway/windows/store.py",
            "tesla_gateway/windows/snapshots.py",
        ),
        (
            *_WINDOW_TESTS,
            f"{_CORE}/test_admission.py",  # admission evicts and reads last_seen
            f"{_CORE}/test_clock_steps.py",  # a clock step moves the stamped sensors' windows
        ),
    ),
    Target(
        "clock sanity",
        ("tesla_gateway/ingest/clock_sanity.py",),
        (
            f"{_CORE}/test_clock_sanity.py",
            f"{_CORE}/test_window_store.py",
            f"{_CORE}/test_clock_steps.py",  # held readings move with a clock step
        ),
    ),
    Target(
        "ingest log",
        (
            "tesla_gateway/ingest/ingest_log.py",
            "tesla_gateway/ingest/log_record.py",
            "tesla_gateway/ingest/log_scan.py",
            "tesla_gateway/ingest/log_segments.py",
            "tesla_gateway/ingest/log_directory.py",
            "tesla_gateway/ingest/log_checkpoint.py",
            "tesla_gateway/ingest/log_replay.py",
            "tesla_gateway/ingest/log_stats.py",
        ),
        (f"{_CORE}/test_ingest_log.py", f"{_CORE}/test_ingest_log_damage.py"),
    ),
    Target(
        "outbox",
        (
            "tesla_gateway/publish/outbox.py",
            "tesla_gateway/publish/outbox_storage.py",
            "tesla_gateway/publish/outbox_messages.py",
            "tesla_gateway/publish/outbox_mirror.py",
        ),
        (f"{_IO}/test_outbox.py",),
    ),
    Target("delivery", ("tesla_gateway/publish/delivery.py",), (f"{_IO}/test_publisher.py",)),
    Target(
        "release verification",
        ("tesla_gateway/ota/release.py", "tesla_gateway/ota/descriptor.py"),
        (f"{_OTA}/test_release.py", f"{_OTA}/test_protocol.py"),
    ),
    Target("slots", ("tesla_gateway/models/slots.py",), (f"{_OTA}/test_slots.py",)),
    Target(
        "admission",
        ("tesla_gateway/ingest/admission.py",),
        (f"{_CORE}/test_admission.py",),
    ),
    Target("sequence", ("tesla_gateway/ingest/sequence.py",), (f"{_CORE}/test_sequence.py",)),
    Target("conformal", ("training/conformal.py",), ("tests/training/test_trust.py",)),
    Target("equivalence", ("training/equivalence.py",), ("tests/training/test_trust.py",)),
    Target("harm guard", ("training/harm.py",), ("tests/training/test_trust.py",)),
    Target(
        "wire parsers",
        (
            "tesla_gateway/sources/line_protocol.py",
            "tesla_gateway/sources/pms5003.py",
            "tesla_gateway/sources/payloads.py",
            "tesla_gateway/sources/payloads_fast.py",
            "tesla_gateway/sources/payload_rules.py",
            "tesla_gateway/mqtt/wire.py",
            "tesla_gateway/ota/protocol.py",
        ),
        (
            f"{_IO}/test_line_protocol.py",
            f"{_IO}/test_pms5003.py",
            f"{_IO}/test_payloads.py",
            f"{_IO}/test_wire.py",
            f"{_OTA}/test_protocol.py",
        ),
        import_time=("tesla_gateway.sources.payloads_fast.x__build_decoder",),
    ),
)


def target_named(name: str) -> Target:
    for target in TARGETS:
        if target.name == name:
            return target
    raise KeyError(f"no mutation target {name!r}; known: {[t.name for t in TARGETS]}")
