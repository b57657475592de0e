"""Where the suite's minutes go: a pytest plugin (tests/conftest.py loads it) that files every
test under one area and prints, at the end of a run, each area's test count and seconds, the
run's wall time, and a warning naming the areas over their share once a run passes its budget.

CI must stay inside 30 minutes on two cores (.ci/run prints this table); the warning starts at
24, so a change that adds time is seen before it costs a landing. The areas, first match wins:

- `soak`: a randomised run counted in rounds (torture, crash harness, two hosts; the long
  versions are `make soak`);
- `own servers`: starts a JVM, Connect server, cluster or multi-gigabyte process of its own
  (the `own_servers` mark; under xdist they run one at a time, tests/conftest.py);
- `fast tier`: marked `fast` (no mongod, no Spark);
- `shared Spark`: uses the session's Spark;
- `mongod only`: the rest (the session mongod, PostgreSQL, the S3 server, Dagster's CLI).

An area's seconds are the sum of its tests' setup, call and teardown, over every worker: with
three workers they add up to about three times the wall time.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest

BUDGET_MINUTES = 30.0
WARN_MINUTES = 24.0
# Each area's share of a 24-minute run, in worker-minutes (three workers: 72 in all). Set from
# the measured run of issue 37 (on two workers, scaled by 3/2); an area over its share is
# where to look first.
SHARES = {
    "fast tier": 3.0,
    "mongod only": 15.0,
    "shared Spark": 18.0,
    "own servers": 21.0,
    "soak": 15.0,
}
AREA_KEY = "suite_area"
HEAVIEST_FILES = 12


def area_of(item: pytest.Item) -> str:
    """The area a test's time is filed under (see the module docstring)."""
    if item.get_closest_marker("soak") is not None:
        return "soak"
    if item.get_closest_marker("own_servers") is not None:
        return "own servers"
    if item.get_closest_marker("fast") is not None:
        return "fast tier"
    if "spark" in getattr(item, "fixturenames", ()):
        return "shared Spark"
    return "mongod only"


class SuiteTime:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)
        self.files: dict[str, float] = defaultdict(float)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # user_properties travel with each report from an xdist worker to the controller.
        for item in items:
            item.user_properties.append((AREA_KEY, area_of(item)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        area = dict(report.user_properties).get(AREA_KEY)
        if area is None:
            return
        self.seconds[area] += report.duration
        self.tests[area].add(report.nodeid)
        self.files[report.nodeid.split("::")[0]] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return
        wall = time.monotonic() - self.started
        workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(
            terminalreporter.config.option, "numprocesses", None
        )
        write = terminalreporter.write_line
        terminalreporter.section("where the time went")
        write(f"{'area':<14}{'tests':>7}{'seconds':>10}{'share (s)':>11}")
        for area in SHARES:
            over = " over its share" if self.seconds[area] > SHARES[area] * 60 else ""
            write(
                f"{area:<14}{len(self.tests[area]):>7}{self.seconds[area]:>10.0f}"
                f"{SHARES[area] * 60:>11.0f}{over}"
            )
        write(
            f"wall time {wall / 60:.1f} min on {workers or 1} worker(s); "
            f"test time {sum(self.seconds.values()) / 60:.1f} worker-min; "
            f"CI budget {BUDGET_MINUTES:.0f} min"
        )
        heaviest = sorted(self.files.items(), key=lambda kv: -kv[1])[:HEAVIEST_FILES]
        write("heaviest files (worker-s): " + ", ".join(f"{f} {s:.0f}" for f, s in heaviest))
        if wall > WARN_MINUTES * 60:
            over = [a for a in SHARES if self.seconds[a] > SHARES[a] * 60]
            terminalreporter.write_line(
                f"WARNING: the suite took {wall / 60:.1f} min, past the {WARN_MINUTES:.0f}-minute "
                f"warning line of CI's {BUDGET_MINUTES:.0f}; over their share: "
                f"{', '.join(over) or 'none (every area grew a little)'}. Win the time back "
                "before landing (share a server, bound a size, group a test).",
                yellow=True,
                bold=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteTime(), "suite_time")
