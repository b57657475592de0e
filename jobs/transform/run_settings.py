"""The session settings a transform run takes for its size, set for the run and put back after.

- A run of large events (`change_log.large_events`): its Arrow UDFs take one row per batch
  (10,000 by default: a task's whole input and output in memory at once, twice over with two
  tasks).
- A small run (few events, and tables that are small, `SMALL_RUN_EVENTS`, `SMALL_TABLE_ROWS`):
  Spark evaluates its expressions interpreted instead of generating and compiling Java for
  each of the run's plans. A small run's rows cost less than its plans: a database stream's
  run plans dozens of Delta statements over a few rows each, and the JVM compiles each plan's
  generated classes and then JIT-compiles them again. Eight small runs of a five-collection
  stream took 124.8 CPU-s against 159.2 with code generation, paired in one session
  (`benchmarks/small_runs.py`). A larger run keeps Spark's defaults, where compiled code pays
  for itself.
  `spark.sql.codegen.factoryMode` is an internal Spark setting (tested on the Spark this
  project pins; the fold's tests run under it), so it is only ever set for a run, never left.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# Up to these, a run is small: its events, and the live rows of the largest table it may
# MERGE into (its MERGE scans the files the keys touch, which can be all of them).
SMALL_RUN_EVENTS = 10_000
SMALL_TABLE_ROWS = 100_000


def settings_for(events: int, largest_table_rows: int, large: bool) -> dict[str, str]:
    """The settings of a run of `events` events (of large ones when `large`) whose stream's
    largest table holds `largest_table_rows` live rows (see the module docstring)."""
    if large:
        return {ARROW_BATCH: "1"}
    if events <= SMALL_RUN_EVENTS and largest_table_rows <= SMALL_TABLE_ROWS:
        return dict(INTERPRETED)
    return {}


@contextmanager
def run_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """`settings` on the session for the block, each put back as it was after it."""
    conf = spark.conf
    before = {key: conf.get(key, None) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)
