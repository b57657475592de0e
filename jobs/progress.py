"""Progress of long work (a snapshot, a drain, a transform), for whoever shows it.

The jobs report to a plain callback, `Callable[[Progress], None]`, which the CLI renders as
one line on a terminal and the orchestration writes to the run's log. A `Meter` keeps the
jobs' side cheap: with no callback it does nothing, and otherwise it calls back at most every
`interval` seconds, except for a new phase and the last report, which always go through (so
a consumer sees every phase and the true total).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """One report: `done` units of `work` on `stream` so far, in its current `phase`."""

    stream: str
    work: str  # "snapshot", "drain" or "transform"
    phase: str  # e.g. "copy", "events", "change log", "current", "commit"
    done: int
    unit: str  # "documents" or "events"
    elapsed_s: float
    total: int | None = None  # an estimate of the whole, when one exists
    final: bool = False
    resumed_from: int = 0  # done by earlier runs (a resumed snapshot): not in the rate

    @property
    def rate(self) -> float | None:
        """Units per second so far."""
        return (self.done - self.resumed_from) / self.elapsed_s if self.elapsed_s > 0 else None

    @property
    def remaining_s(self) -> float | None:
        """Seconds to go at the rate so far, when there is a total to go by."""
        if self.final or not self.total or not self.rate or self.done >= self.total:
            return None
        return (self.total - self.done) / self.rate


ProgressCallback = Callable[[Progress], None]


def describe(progress: Progress) -> str:
    """One line, e.g. `orders snapshot (copy): 120,000 / ~500,000 documents, 8,000/s, ~47 s
    left, 15 s so far`."""
    p = progress
    of = f" / ~{p.total:,}" if p.total else ""
    line = f"{p.stream} {p.work} ({p.phase}): {p.done:,}{of} {p.unit}"
    if p.rate is not None and p.done:
        line += f", {p.rate:,.0f}/s"
    if p.remaining_s is not None:
        line += f", ~{_duration(p.remaining_s)} left"
    line += f", {_duration(p.elapsed_s)} so far" if not p.final else f" in {_duration(p.elapsed_s)}"
    return line


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    return (
        f"{minutes // 60} h {minutes % 60:02d} min"
        if minutes >= 60
        else f"{minutes} min {secs:02d} s"
    )


class Meter:
    """Counts one piece of work and reports it, throttled; a no-op without a callback."""

    def __init__(
        self,
        callback: ProgressCallback | None,
        stream: str,
        work: str,
        unit: str,
        *,
        phase: str = "",
        total: int | None = None,
        resumed_from: int = 0,
        interval: float = 0.5,
    ) -> None:
        self.callback = callback
        self.stream, self.work, self.unit = stream, work, unit
        self.phase, self.total, self.interval = phase, total, interval
        self.done = self.resumed_from = resumed_from
        self.started = time.monotonic()
        self._reported = float("-inf")

    def count(self, done: int) -> None:
        """`done` units so far (a running total, not an increment)."""
        self.done = done
        if self.callback is not None and time.monotonic() - self._reported >= self.interval:
            self._report(False)

    def enter(self, phase: str, total: int | None = None, done: int | None = None) -> None:
        """A new phase begins (with `done` units so far, if given): always reported."""
        self.phase = phase
        if total is not None:
            self.total = total
        if done is not None:
            self.done = done
        if self.callback is not None:
            self._report(False)

    def finish(self) -> None:
        if self.callback is not None:
            self._report(True)

    def _report(self, final: bool) -> None:
        now = time.monotonic()
        self._reported = now
        assert self.callback is not None
        self.callback(
            Progress(
                stream=self.stream,
                work=self.work,
                phase=self.phase,
                done=self.done,
                unit=self.unit,
                elapsed_s=now - self.started,
                total=self.total,
                final=final,
                resumed_from=self.resumed_from,
            )
        )


def sparse(callback: ProgressCallback, every_s: float) -> ProgressCallback:
    """`callback` for a log: new phases and the last report, and otherwise one per `every_s`."""
    last_at, last_phase = float("-inf"), None

    def report(progress: Progress) -> None:
        nonlocal last_at, last_phase
        now = time.monotonic()
        if progress.final or progress.phase != last_phase or now - last_at >= every_s:
            last_at, last_phase = now, progress.phase
            callback(progress)

    return report
