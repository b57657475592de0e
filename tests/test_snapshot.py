"""Initial snapshot and re-snapshot: existing data in, resumable, and exact with the oracle."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.drain import drain, drain_until_caught_up
from jobs.tables import read_current
from jobs.transform import transform
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.mongo import connect
from tests.helpers.oracle import burst, current_state, make_doc, source_state
from tests.test_failures import roll_oplog_past
from tidemark.errors import HistoryLost

ROOT = Path(__file__).resolve().parent.parent


def _seed(client, db, n, seed=5):
    rng = random.Random(seed)
    client[db]["orders"].insert_many([make_doc(rng, k) for k in range(n)])
    # Mixed _id types: the copy must follow the _id index across types.
    client[db]["orders"].insert_many([make_doc(rng, f"s{k}") for k in range(50)])


def test_snapshot_with_concurrent_writes_then_drain_equals_the_source(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    _seed(client, db_name, 3000)
    stream = make_stream(start="snapshot", snapshot_chunk_size=400)
    rng = random.Random(9)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            burst(client, db_name, "orders", rng, 50)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        first = drain(stream, raw_client, sqlite_store, lake)
    finally:
        stop.set()
        thread.join()
    assert first.snapshot is not None and first.snapshot.status == "done"
    assert first.snapshot.chunks >= 8 and first.snapshot.documents >= 3050
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    got = current_state(read_current(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders")


def test_a_killed_snapshot_resumes_from_its_last_committed_chunk(
    mongod,
    spark,
    client,
    raw_client,
    sqlite_store,
    state_url_sqlite,
    lake,
    make_stream,
    db_name,
    tmp_path,
):
    _seed(client, db_name, 2000)
    stream = make_stream(start="snapshot", snapshot_chunk_size=300)
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.snapshot_child",
            mongod.uri,
            state_url_sqlite,
            str(lake),
            stream.model_dump_json(),
            str(ready),
            "3",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    (killed,) = sqlite_store.snapshots(stream.name)
    assert killed.status == "running" and killed.chunks == 3 and killed.documents == 900

    client[db_name]["orders"].delete_many({"_id": {"$lt": 100}})  # already copied: then deleted
    client[db_name]["orders"].insert_one({"_id": 99_999, "late": True})
    result = drain(stream, raw_client, sqlite_store, lake)
    (finished,) = sqlite_store.snapshots(stream.name)
    assert finished.id == killed.id and finished.status == "done"
    assert finished.chunks > 3  # continued, not restarted
    assert result.snapshot.id == killed.id
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    got = current_state(read_current(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders")


@pytest.mark.parametrize("policy", ["fail", "resnapshot"])
def test_lost_history_fails_or_resnapshots_to_an_exact_state(
    policy, spark, tmp_path, sqlite_store, make_stream
):
    small = start_mongod(tmp_path / "tiny", oplog_size_mb=1, extra_args=("--syncdelay", "1"))
    lake = tmp_path / "lake"
    try:
        client = connect(small.uri)
        raw = connect(small.uri, raw=True)
        client.shop.orders.insert_many([{"_id": i, "v": i} for i in range(200)])
        stream = make_stream(
            database="shop",
            collection="orders",
            start="snapshot",
            on_history_lost=policy,
            snapshot_chunk_size=64,
        )
        drain_until_caught_up(stream, raw, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        kept = sqlite_store.checkpoint(stream.name)
        # While the stream is away: deletes and updates, then the oplog rolls past its token.
        client.shop.orders.delete_many({"_id": {"$lt": 50}})
        client.shop.orders.update_many({}, {"$inc": {"v": 1000}})
        roll_oplog_past(client, kept.cluster_time)
        client.shop.filler.drop()

        if policy == "fail":
            batches = sqlite_store.batch_count(stream.name)
            with pytest.raises(HistoryLost):
                drain(stream, raw, sqlite_store, lake)
            assert sqlite_store.checkpoint(stream.name) == kept
            assert sqlite_store.batch_count(stream.name) == batches
            return
        result = drain(stream, raw, sqlite_store, lake)
        assert result.snapshot is not None and result.snapshot.reason == "history lost"
        drain_until_caught_up(stream, raw, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        got = current_state(read_current(spark, sqlite_store, lake, stream.name))
        assert got == source_state(raw, "shop", "orders")
        assert len(got) == 150  # the 50 deleted in the gap are gone from current too
        client.close()
        raw.close()
    finally:
        stop_mongod(small)
