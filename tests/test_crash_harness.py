"""Crash consistency: drains, transforms and compactions SIGKILLed at random moments, between
bursts of writes. After one clean run, `current` equals the source and `changes` holds every
event once, before and after `tidemark gc` removes what the dead runs left (raw files, and with
Delta VACUUM the files the tables no longer use) and a compaction (Delta OPTIMIZE); the state
store records each table's newest Delta version. The kills at exact points of a run's Delta
commits are tests/test_delta_kills.py."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from jobs.capture import drain, drain_until_caught_up
from jobs.ops import collect_garbage
from jobs.transform import compact, read_current, transform
from state import TransformState
from tests.helpers.delta_reading import (
    changes_event_ids,
    current_documents,
    current_tables,
    delta_version,
)
from tests.helpers.lake_reading import direct_events
from tests.helpers.oracle import burst, current_state, seed_collection, source_state

ROOT = Path(__file__).resolve().parent.parent
# (step, seconds after start to kill it): a drain child lives ~1-2 s, a transform child ~8-15 s
# (the JVM starts first), so the kills land in imports, reads, writes and commits; a compaction
# child transforms first, then compacts, so its kills also land between OPTIMIZE and the state
# store's commit.
STEPS = [
    ("drain", (0.3, 2.5)),
    ("drain", (0.3, 2.5)),
    ("transform", (3.0, 14.0)),
    ("compact", (6.0, 22.0)),
]


def _run_and_kill(step, window, rng, mongod, state_url, lake, stream) -> bool:
    child = subprocess.Popen(
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(rng.uniform(*window))
    killed = child.poll() is None
    if killed:
        child.send_signal(signal.SIGKILL)
    _, err = child.communicate(timeout=120)
    assert killed or child.returncode == 0, err[-2000:]
    return killed


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.own_servers
def test_thirty_random_kills_lose_nothing_and_duplicate_nothing(
    mongod, spark, client, raw_client, sqlite_store, state_url_sqlite, lake, make_stream, db_name
):
    rng = random.Random(2026)
    stream = make_stream(budget={"max_events": 700})
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token
    seed_collection(client, db_name, "orders", rng)
    kills: Counter[str] = Counter()
    while kills.total() < 30:
        burst(client, db_name, "orders", rng, 300)
        for step, window in STEPS:
            kills[step] += _run_and_kill(step, window, rng, mongod, state_url_sqlite, lake, stream)
    # Every kind of run died mid-way (a window that always lets one finish would leave its
    # crashes untested while the count still reached 30).
    assert kills["drain"] and kills["transform"] and kills["compact"], kills

    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    want = source_state(raw_client, db_name, "orders")
    assert current_state(read_current(spark, sqlite_store, lake, stream.name)) == want
    (path,) = current_tables(sqlite_store, lake, stream.name).values()
    assert current_documents(path) == want  # any Delta reader, at the newest version
    for table in TransformState(sqlite_store).tables(stream.name):
        assert table.delta_version == delta_version(lake / table.path), table
    # What the dead runs left goes: raw files no batch lists, files no kept version uses.
    collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    compact(spark, sqlite_store, lake, stream)
    assert current_state(read_current(spark, sqlite_store, lake, stream.name)) == want
    assert current_documents(path) == want
    (table,) = [t for t in TransformState(sqlite_store).tables(stream.name) if t.kind == "current"]
    assert table.delta_version == delta_version(path)  # the compaction's OPTIMIZE, recorded
    reference = [
        e["_id"]["_data"] for e in direct_events(raw_client[db_name]["orders"], start.document)
    ]
    logged = changes_event_ids(sqlite_store, lake, stream.name)
    assert len(logged) == len(set(logged))  # no event twice
    assert sorted(logged) == sorted(reference)  # and none missing
