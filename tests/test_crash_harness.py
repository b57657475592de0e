"""Crash consistency: drains, transforms and compactions SIGKILLed at random moments of their
runs (drawn from the moment a child's run has begun, not while its JVM starts), between bursts
of writes, until every kind of kill point was hit twice. After one clean run, `current` equals
the source and `changes` holds every event once, before and after `tidemark gc` removes what
the dead runs left (raw files, and with Delta VACUUM the files the tables no longer use) and a
compaction (Delta OPTIMIZE); the state store records each table's newest Delta version. The
kills at exact points of a run's Delta commits are tests/test_delta_kills.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from jobs.capture import drain, drain_until_caught_up
from jobs.ops import collect_garbage
from jobs.transform import compact, exact_documents, transform
from tests.helpers.delta_reading import (
    changes_event_ids,
    current_documents,
    current_tables,
    delta_version,
)
from tests.helpers.lake_reading import direct_events
from tests.helpers.oracle import burst, current_state, seed_collection, source_state

ROOT = Path(__file__).resolve().parent.parent
# Where a kill lands, as (step, the child's last report before it: tests/helpers/
# crash_child.py): a drain mid-run; a transform before its first Delta commit, and after one
# (between tables, or before the state store's commit); a compaction during OPTIMIZE or
# before its commit is recorded. Each is aimed at: its moment is drawn from the report that
# opens it (the run's `begun`, not the process's start, so no kill is spent on a JVM
# starting) over the length that phase took in the step's last finished run. The harness
# stops once every point was hit KILLS_PER_POINT times (TIDEMARK_KILLS_PER_POINT: more).
POINTS = {
    ("drain", "begun"): "begun",
    ("transform", "begun"): "begun",
    ("transform", "committed"): "committed",
    ("compact", "compacting"): "compacting",
}
KILLS_PER_POINT = int(os.environ.get("TIDEMARK_KILLS_PER_POINT", 2))
MAX_ROUNDS = 12 * KILLS_PER_POINT  # a bound, reached only if the aim stops fitting the runs
REPORTS = ("begun", "committed", "compacting")


class Child:
    """A crash child and the reports it has printed so far, with when each came."""

    def __init__(self, step: str, mongod, state_url: str, lake, stream) -> None:
        self.step = step
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.crash_child",
                step,
                mongod.uri,
                state_url,
                str(lake),
                stream.model_dump_json(),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.reports: list[tuple[float, str]] = []
        self.ended = False
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.strip() in REPORTS:
                with self.changed:
                    self.reports.append((time.monotonic(), line.strip()))
                    self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def first(self, report: str) -> float | None:
        """When the child printed `report` (waiting for it); None when it ended first."""
        with self.changed:
            self.changed.wait_for(
                lambda: self.ended or any(r == report for _, r in self.reports), timeout=300
            )
            return next((t for t, r in self.reports if r == report), None)

    def finish(self, kill_at: float | None) -> str | None:
        """SIGKILL the child at `kill_at` (monotonic) unless it ends first; where it was when
        killed, or None when it finished (then it must have succeeded)."""
        point = None
        try:
            timeout = None if kill_at is None else max(0.0, kill_at - time.monotonic())
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGKILL)
            with self.changed:
                point = self.reports[-1][1] if self.reports else None
        _, err = self.process.communicate(timeout=120)
        self.reader.join(timeout=10)
        assert self.process.returncode == -9 or self.process.returncode == 0, err[-2000:]
        return point

    def spans(self) -> dict[str, float]:
        """A finished run's phases, in seconds from the report that opens each to the next
        phase (or its end): the lengths the next kills are drawn over."""
        end = time.monotonic()
        times = {r: t for t, r in reversed(self.reports)}  # each report's first time
        begun, committed = times.get("begun"), times.get("committed")
        spans = {}
        if begun is not None:
            spans["begun"] = (committed or times.get("compacting") or end) - begun
        if committed is not None:
            spans["committed"] = (times.get("compacting") or end) - committed
        if "compacting" in times:
            spans["compacting"] = end - times["compacting"]
        return spans


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.own_servers
def test_kills_at_every_point_lose_nothing_and_duplicate_nothing(
    mongod, spark, client, raw_client, sqlite_store, state_url_sqlite, lake, make_stream, db_name
):
    rng = random.Random(2026)
    stream = make_stream(budget={"max_events": 700})
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token
    seed_collection(client, db_name, "orders", rng)
    kills: Counter[tuple[str, str]] = Counter()
    # Each phase's length before one was measured (seconds): the first aims are guesses.
    span = {"drain": {"begun": 1.0}, "transform": {"begun": 4.0, "committed": 1.0}}
    span["compact"] = {"begun": 4.0, "committed": 1.0, "compacting": 3.0}
    log: list[str] = []
    rounds = 0
    while any(kills[p] < KILLS_PER_POINT for p in POINTS) and rounds < MAX_ROUNDS:
        rounds += 1
        burst(client, db_name, "orders", rng, 300)
        for step in ("drain", "drain", "transform", "compact"):
            # The step's point hit least so far, if any still needs a kill.
            wanted = sorted(
                (kills[p], p[1]) for p in POINTS if p[0] == step and kills[p] < KILLS_PER_POINT
            )
            if not wanted and step != "drain":
                continue  # a JVM's start for no kill: the drains alone keep the data moving
            child = Child(step, mongod, state_url_sqlite, lake, stream)
            kill_at = None
            if wanted:
                opened = child.first(POINTS[step, wanted[0][1]])
                if opened is not None:
                    kill_at = opened + rng.uniform(0, span[step][wanted[0][1]])
            point = child.finish(kill_at)
            if point is None:
                span[step].update(child.spans())
            elif (step, point) in POINTS:
                kills[step, point] += 1
            log.append(f"round {rounds}: {step} aimed at {wanted[:1]}, killed at {point}")
    print("\n".join(log))
    # Every point was hit (aims that always let a run finish, or always kill it early, would
    # leave its crashes untested).
    assert all(kills[p] >= KILLS_PER_POINT for p in POINTS), "\n".join([str(kills), *log])

    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    want = source_state(raw_client, db_name, "orders")
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == want
    (path,) = current_tables(sqlite_store, lake, stream.name).values()
    assert current_documents(path) == want  # any Delta reader, at the newest version
    for table in sqlite_store.transforms.tables(stream.name):
        assert table.delta_version == delta_version(lake / table.path), table
    # What the dead runs left goes: raw files no batch lists, files no kept version uses.
    collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    compact(spark, sqlite_store, lake, stream)
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == want
    assert current_documents(path) == want
    (table,) = [t for t in sqlite_store.transforms.tables(stream.name) if t.kind == "current"]
    assert table.delta_version == delta_version(path)  # the compaction's OPTIMIZE, recorded
    reference = [
        e["_id"]["_data"] for e in direct_events(raw_client[db_name]["orders"], start.document)
    ]
    logged = changes_event_ids(sqlite_store, lake, stream.name)
    assert len(logged) == len(set(logged))  # no event twice
    assert sorted(logged) == sorted(reference)  # and none missing
