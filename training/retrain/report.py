"""The retraining report: ``report.json`` (everything) and ``report.md`` (a page a person reads)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["REPORT_JSON", "REPORT_MD", "RetrainReport", "render_markdown", "write_report"]

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
Decision = Literal["accepted", "rejected", "error"]


@dataclass
class RetrainReport:
    """Every input, figure and decision of one run, filled in stage by stage as it gets there.

    A section is ``None`` until its stage has run, so a failed run's report shows how far it
    got; ``release`` is written once a decision was reached (``null``: nothing released).
    """

    created_at: str
    config: dict[str, Any]
    decision: Decision = "error"
    reason: str = ""
    champion: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    challenger: dict[str, Any] | None = None
    figures: dict[str, Any] | None = None
    margin: dict[str, Any] | None = None
    release: dict[str, Any] | None = None
    comparison: dict[str, str] | None = None  # the decision a failure after it overturned

    def failed(self, exc: BaseException) -> None:
        """The run stopped at ``exc``; a decision already reached is kept as ``comparison``."""
        if self.decision != "error":
            self.comparison = {"decision": self.decision, "reason": self.reason}
        self.decision = "error"
        self.reason = f"{type(exc).__name__}: {exc}"

    def as_json(self) -> dict[str, Any]:
        document = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) is not None
        }
        if self.decision != "error":
            document["release"] = self.release
        return document

    def write(self, out_dir: Path) -> None:
        write_report(out_dir / REPORT_JSON, out_dir / REPORT_MD, self.as_json())


def write_report(json_path: Path, markdown_path: Path, report: Mapping[str, Any]) -> None:
    """Write both files (the JSON first: it is the record, the page is a view of it)."""
    json_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    markdown_path.write_text(render_markdown(report), encoding="utf-8")


def render_markdown(report: Mapping[str, Any]) -> str:
    champion = report.get("champion") or {}
    challenger = report.get("challenger") or {}
    decision = str(report.get("decision", "error")).upper()
    title = champion.get("name", "model")
    versions = f"v{champion['version']}" if "version" in champion else ""
    if "version" in challenger:
        versions += f" → v{challenger['version']}"
    lines = [
        f"# Retraining {title} {versions}: {decision}".rstrip(),
        "",
        f"{report.get('reason', '')}",
        "",
        f"Run at {report.get('created_at', '?')}.",
    ]
    data = report.get("data")
    if data:
        lines += ["", "## Data", ""]
        pairs = data.get("pairs", {})
        lines.append(
            f"- Pairs: `{pairs.get('directory')}`, {len(pairs.get('files', []))} file(s), "
            f"{pairs.get('rows')} row(s) of sensor(s) {', '.join(pairs.get('sensors', []))} "
            f"from {pairs.get('first')} to {pairs.get('last')}; "
            f"{pairs.get('truncated_lines_skipped', 0)} torn line(s) skipped; published by "
            f"model version(s) {pairs.get('model_versions') or 'none'}."
        )
        cleaning = pairs.get("cleaning")
        if cleaning:
            lines.append(
                f"- Cleaning kept {cleaning['rows_kept']} row(s); dropped "
                f"{cleaning['rows_dropped'] or 'none'}; sensors dropped "
                f"{cleaning['sensors_dropped'] or 'none'}."
            )
        original = data.get("original")
        if original:
            lines.append(
                f"- Original data: {original['dataset']} ({original['source']}), sensors "
                f"{', '.join(original['sensors'])}."
            )
        periods = data.get("periods")
        if periods:
            lines.append(f"- Held back: {data.get('holdout')} = {periods['held_back']}.")
            lines.append(f"- Training period: {periods['training']}.")
            if periods.get("validation"):
                lines.append(f"- Validation period (epoch selection): {periods['validation']}.")
        windows = data.get("windows")
        if windows:
            described = ", ".join(f"{key} {value}" for key, value in windows.items())
            lines.append(f"- Windows: {described}.")
    if challenger:
        lines += [
            "",
            "## Challenger",
            "",
            f"- {challenger.get('mode')} {challenger.get('architecture')}, "
            f"N={challenger.get('window_length')}, {challenger.get('epochs_run')} of "
            f"{challenger.get('epochs')} epoch(s), batch {challenger.get('batch_size')}, "
            f"learning rate {challenger.get('learning_rate')}, seed {challenger.get('seed')}.",
        ]
        export = challenger.get("export")
        if export:
            lines.append(
                f"- Exported to `{challenger.get('model_dir')}` ({', '.join(export['files'])}); "
                f"device graph: {export['device_graph']}."
            )
    figures = report.get("figures")
    if figures:
        lines += [
            "",
            f"## Held-back period ({figures['n']} windows, same for both models)",
            "",
            "| | RMSE | MAE | n |",
            "|---|---|---|---|",
        ]
        rows = [
            ("raw (uncalibrated)", figures["raw"]),
            ("linear fit on the training windows", figures["linear"]),
            (f"champion v{champion.get('version')}", figures["champion"]),
            (f"challenger v{challenger.get('version')}", figures["challenger"]),
            ("published by the gateway", figures["recorded_by_gateway"]["all"]),
        ]
        lines += [
            f"| {label} | {m['rmse']:.3f} | {m['mae']:.3f} | {m['n']} |"
            if m["n"]
            else f"| {label} | – | – | 0 |"
            for label, m in rows
        ]
    margin = report.get("margin")
    if margin:
        lines += [
            "",
            "## Decision",
            "",
            f"- Margin: {margin['relative']:.1%} relative, {margin['absolute']} absolute; "
            f"required RMSE {margin['required_rmse']:.3f}; improvement "
            f"{margin['improvement']:.3f} ({margin['improvement_fraction']:.1%}).",
            f"- {decision.capitalize()}: {report.get('reason')}.",
        ]
    release = report.get("release")
    if release:
        pushed = (
            f"pushed to `{release['topic']}` on {release['broker']}"
            if release.get("pushed")
            else "not pushed"
        )
        lines += [
            "",
            "## Release",
            "",
            f"- `{release['path']}` ({release['target']}), signed by key {release['key_id']}; "
            f"{pushed}.",
        ]
    elif report.get("decision") == "accepted":
        lines += ["", "## Release", "", "- Exported only (no key given): not signed, not pushed."]
    return "\n".join(lines) + "\n"
