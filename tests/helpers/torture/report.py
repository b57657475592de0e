"""The report of a run (its seed, runs, kills and a table of verdicts), and `run_torture`: run,
check, report."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from tests.helpers.torture.checks import CHECKS, Oracle, Verdict
from tests.helpers.torture.config import TortureConfig
from tests.helpers.torture.scheduler import Torture
from tidemark.object_path import LakePath


def report(
    torture: Torture, verdicts: list[Verdict], captured: dict[str, int], seconds: float
) -> str:
    """The seed, the table of runs and checks, and for failures the details and the step log."""
    t, s = torture, torture.stats
    lines = [
        f"torture seed {t.cfg.seed}: {seconds:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in t.seconds.items())
        + f"), databases {t.db_a} / {t.db_b}",
        "runs:  " + ", ".join(f"{k} {v}" for k, v in sorted(s.runs.items())),
        "kills: " + (", ".join(f"{k} {v}" for k, v in sorted(s.kills.items())) or "none"),
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items())),
        "writes: " + ", ".join(f"{k} {v}" for k, v in sorted(t.writers.writes.items())),
        "snapshots: " + ", ".join(f"{k} {v}" for k, v in sorted(snapshot_reasons(t).items())),
        "",
        f"{'stream':10} {'captured':>8}  " + "  ".join(f"{c:8}" for c in CHECKS),
    ]
    by = {(v.stream, v.check): v for v in verdicts}
    for name in t.streams:
        cells = [("ok" if by[(name, c)].ok else "FAIL") if (name, c) in by else "-" for c in CHECKS]
        lines.append(f"{name:10} {captured.get(name, 0):>8}  " + "  ".join(f"{c:8}" for c in cells))
    failed = [v for v in verdicts if not v.ok]
    if t.final_errors:
        lines += ["", "errors of the final clean runs:"]
        lines += [f"  {k}: {v}" for k, v in t.final_errors.items()]
    if s.unexpected or t.writers.errors:
        lines += ["", "unexpected exceptions:"] + [
            f"  {u}" for u in s.unexpected[:5] + t.writers.errors
        ]
    if failed:
        lines += ["", "failures:"] + [f"  {v.stream}/{v.check}: {v.detail}" for v in failed]
        lines += ["", f"step log (seed {t.cfg.seed}):", t.log.tail(400)]
    return "\n".join(lines)


def snapshot_reasons(torture: Torture) -> Counter[str]:
    return Counter(s.reason for name in torture.streams for s in torture.store.snapshots(name))


def run_torture(
    uri: str, lake: LakePath, state_url: str, cfg: TortureConfig, spark: Any = None
) -> tuple[bool, str, Torture]:
    """Run, check, report: (every check passed, the report, the run)."""
    clock = time.monotonic()
    torture = Torture(uri, lake, state_url, cfg, spark)
    try:
        torture.run()
        oracle = Oracle(torture)
        checking = time.monotonic()
        verdicts = oracle.check_all()
        torture.seconds["checks"] = time.monotonic() - checking
        ok = all(v.ok for v in verdicts) and not torture.final_errors
        ok = ok and not torture.stats.unexpected
        return ok, report(torture, verdicts, oracle.captured, time.monotonic() - clock), torture
    finally:
        torture.writers.stop.set()
