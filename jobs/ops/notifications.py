"""What a failure notification says, and which failures deserve one: plain data in, one
paragraph out. The Dagster sensors that gather the data (`orchestration.notifications`) and the
post itself (`resources.webhook`) live elsewhere."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warn"]
_DOTTED_CLASS = re.compile(r"^(?:[A-Za-z_][\w]*\.)+([A-Z]\w*:)")


@dataclass(frozen=True)
class FailedCheck:
    """One asset check evaluation that did not pass."""

    asset_path: tuple[str, ...]  # the asset key's parts; a Tidemark key starts with the stream
    check: str
    severity: Severity
    description: str | None = None


def stream_of(names: Iterable[str], job: str = "", asset_path: Sequence[str] = ()) -> str | None:
    """The configured stream a run or check concerns: the first part of a Tidemark asset key,
    else the stream whose name prefixes the job's (`<stream>_drain`, `<stream>_sync`, ...)."""
    known = set(names)
    if asset_path and asset_path[0] in known:
        return asset_path[0]
    prefixes = [n for n in known if job.startswith(f"{n}_") or job == n]
    return max(prefixes, key=len) if prefixes else None


def run_link(ui_url: str | None, run_id: str) -> str | None:
    return f"{ui_url.rstrip('/')}/runs/{run_id}" if ui_url else None


def first_line(text: str | None) -> str:
    """The error's first non-empty line (a Tidemark error is one paragraph; a traceback's first
    line names the exception)."""
    for line in (text or "").splitlines():
        if line.strip():
            # "tidemark.errors.HistoryLost: ..." reads "HistoryLost: ...": the class names the
            # failure, its module path is noise in a chat message.
            return _DOTTED_CLASS.sub(r"\1", line.strip(), count=1)
    return "no error message was recorded"


def run_failure_text(
    job: str, run_id: str, error: str | None, stream: str | None, ui_url: str | None
) -> str:
    """One paragraph for a failed run: stream, job, run, the error's first line, the link."""
    subject = f"stream {stream}: " if stream else ""
    link = run_link(ui_url, run_id)
    return f"Tidemark {subject}run {run_id[:8]} of job {job} failed: {first_line(error)}" + (
        f" {link}" if link else f" (run id {run_id})"
    )


def to_report(checks: Iterable[FailedCheck], least: Severity) -> list[FailedCheck]:
    """The failed checks at or above the configured severity (warn reports both)."""
    return [c for c in checks if least == "warn" or c.severity == "error"]


def check_failure_text(
    checks: Sequence[FailedCheck], job: str, run_id: str, stream: str | None, ui_url: str | None
) -> str:
    """One paragraph for a run's failed checks: each named with its asset and first line."""
    subject = f"stream {stream}: " if stream else ""
    named = "; ".join(
        f"{c.check} on {'/'.join(c.asset_path)} ({c.severity.upper()}"
        + (f": {first_line(c.description)})" if c.description else ")")
        for c in checks
    )
    plural = "s" if len(checks) > 1 else ""
    link = run_link(ui_url, run_id)
    return f"Tidemark {subject}check{plural} failed in run {run_id[:8]} of job {job}: {named}" + (
        f" {link}" if link else f" (run id {run_id})"
    )
