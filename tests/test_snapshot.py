"""Initial snapshot and re-snapshot: existing data in, resumable, and exact with the oracle."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import bson
import bsonjs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp, json_util
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS

from jobs.capture import drain, drain_until_caught_up
from jobs.capture.drain_run import DrainSeams
from jobs.capture.snapshot import key_from_text, read_chunk
from jobs.transform import exact_documents, read_current, transform
from jobs.transform.identity import identity_key
from resources.mongo import connect
from tests.helpers.oplog import roll_oplog_past
from tests.helpers.oracle import (
    burst,
    canonical,
    current_key,
    current_state,
    make_doc,
    source_state,
)
from tidemark.errors import HistoryLost, SnapshotOutrun
from tidemark.tokens import CANONICAL

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
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
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
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders")


@pytest.fixture
def shop_on_tiny_oplog(tiny_mongod):
    """Clients (plain, raw) of a mongod whose oplog rolls in seconds, with 200 `shop.orders`."""
    client = connect(tiny_mongod.uri)
    raw = connect(tiny_mongod.uri, raw=True)
    client.shop.orders.insert_many([{"_id": i, "v": i} for i in range(200)])
    yield client, raw
    client.close()
    raw.close()


def _resnapshots_to_the_source(spark, store, lake, stream, raw) -> None:
    """The next drain copies the collection again (history lost); `current` is then exact,
    without the 50 documents deleted while the stream was away."""
    result = drain(stream, raw, store, lake)
    assert result.snapshot is not None and result.snapshot.reason == "history lost"
    drain_until_caught_up(stream, raw, store, lake)
    transform(spark, store, lake, stream)
    got = current_state(exact_documents(spark, store, lake, stream.name))
    assert got == source_state(raw, "shop", "orders")
    assert len(got) == 150


@pytest.mark.parametrize("policy", ["fail", "resnapshot"])
def test_lost_history_fails_or_resnapshots_to_an_exact_state(
    policy, spark, tmp_path, sqlite_store, make_stream, shop_on_tiny_oplog
):
    lake = tmp_path / "lake"
    client, raw = shop_on_tiny_oplog
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
    _resnapshots_to_the_source(spark, sqlite_store, lake, stream, raw)


def test_a_copy_outrun_by_the_oplog_says_so_and_the_next_run_copies_again(
    spark, tmp_path, sqlite_store, make_stream, shop_on_tiny_oplog
):
    """on_history_lost: resnapshot, and the oplog rolls past the fresh copy's time while it
    copies: the run ends with SnapshotOutrun (a HistoryLost) naming the fix, the copy stays
    committed and nothing else moves; the next run copies again and `current` is exact."""
    lake = tmp_path / "lake"
    client, raw = shop_on_tiny_oplog
    stream = make_stream(
        database="shop",
        collection="orders",
        on_history_lost="resnapshot",
        snapshot_chunk_size=64,
    )
    drain_until_caught_up(stream, raw, sqlite_store, lake)
    kept = sqlite_store.checkpoint(stream.name)
    client.shop.orders.delete_many({"_id": {"$lt": 50}})
    roll_oplog_past(client, kept.cluster_time)

    def roll_during_the_copy(snapshot) -> None:
        if snapshot.reason == "history lost" and snapshot.chunks == 1:
            roll_oplog_past(client, snapshot.cluster_time)

    with pytest.raises(SnapshotOutrun) as outrun:
        drain(stream, raw, sqlite_store, lake, seams=DrainSeams(after_chunk=roll_during_the_copy))
    assert "replSetResizeOplog" in outrun.value.fix
    copy = sqlite_store.running_snapshot(stream.name)
    assert copy is None  # the copy finished and is committed
    client.shop.filler.drop()

    _resnapshots_to_the_source(spark, sqlite_store, lake, stream, raw)


# -- _id order across BSON types, byte-bounded chunks, dates outside Python's range ----------

# Decodes dates outside Python's datetime range as DatetimeMS: the oracle's own key encoding.
_AUTO = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)
# Dates Python's datetime cannot hold: before year 1, after year 9999, and the extremes.
_FAR_DATES = [
    DatetimeMS(-(2**62)),
    DatetimeMS(-62_135_596_800_001),  # one millisecond before 0001-01-01
    DatetimeMS(253_402_300_800_000),  # 10000-01-01
    DatetimeMS(2**62),
]


class _Crash(Exception):
    """A run dying between two committed chunks."""


def _crash_after(chunks: int):
    def hook(snapshot) -> None:
        if snapshot.chunks == chunks:
            raise _Crash

    return hook


def _raw_source_state(raw_client, db: str, coll: str) -> dict[str, str]:
    """`source_state` for any _id, dates outside Python's range included."""
    state = {}
    for doc in raw_client[db][coll].find():
        raw = bytes(doc.raw)  # a memoryview for documents of 4 KB and more
        state[current_key(raw, _AUTO)] = canonical(raw)
    return state


def _snapshot_rows(store, lake: Path, stream: str) -> list[list[str]]:
    """The document keys of each snapshot chunk, chunks in copy order."""
    chunks = []
    for batch in store.batches(stream, source="snapshot"):
        table = pa.concat_tables([pq.read_table(lake / f.path) for f in batch.files])
        rows = table.filter(pc.equal(table["operation_type"], "snapshot"))
        ids, keys = rows["event_id"].to_pylist(), rows["document_key"].to_pylist()
        chunks.append(sorted(zip(ids, keys, strict=True)))
    chunks.sort(key=lambda rows: rows[0][0] if rows else "")
    return [[key for _, key in rows] for rows in chunks if rows]


def _every_type_of_id() -> list:
    return [
        MinKey(),
        MaxKey(),
        None,
        -5,
        0,
        7,
        Int64(2**40),
        2.5,
        -0.5,
        Decimal128("3.25"),
        "",
        "a",
        "ü and more",
        {"a": 1},
        {"a": {"b": [1, 2]}},
        {"z": None},
        Binary(b"\x00\x01", 0),
        Binary(uuid.UUID(int=7).bytes, 4),
        ObjectId(),
        ObjectId(),
        False,
        True,
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2026, 11, 21, tzinfo=UTC),
        Timestamp(5, 6),
        Timestamp(7, 1),
    ]


@pytest.mark.parametrize("chunk_size", [2, 3])
def test_every_bson_type_of_id_is_copied_exactly_once_across_small_chunks_and_a_crash(
    chunk_size, spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    ids = _every_type_of_id()
    client[db_name]["orders"].insert_many([{"_id": v, "n": n} for n, v in enumerate(ids)])
    stream = make_stream(start="snapshot", snapshot_chunk_size=chunk_size)
    with pytest.raises(_Crash):
        drain(stream, raw_client, sqlite_store, lake, seams=DrainSeams(after_chunk=_crash_after(3)))
    (crashed,) = sqlite_store.snapshots(stream.name)
    assert crashed.status == "running" and crashed.documents == 3 * chunk_size
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)

    expected = _raw_source_state(raw_client, db_name, "orders")
    copied = [key for chunk in _snapshot_rows(sqlite_store, lake, stream.name) for key in chunk]
    # Every document once: none lost, none twice (the copies keep their keys' types).
    assert sorted(map(identity_key, copied)) == sorted(expected)
    assert all(
        len(chunk) <= chunk_size for chunk in _snapshot_rows(sqlite_store, lake, stream.name)
    )
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == expected


def test_a_max_key_id_after_the_first_chunk_is_copied(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    client[db_name]["orders"].insert_many(
        [{"_id": MaxKey()}, {"_id": MinKey()}, *({"_id": k} for k in range(5))]
    )
    stream = make_stream(start="snapshot", snapshot_chunk_size=2)
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    chunks = _snapshot_rows(sqlite_store, lake, stream.name)
    assert chunks[-1][-1] == '{ "_id" : { "$maxKey" : 1 } }'
    assert sum(map(len, chunks)) == 7
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == _raw_source_state(raw_client, db_name, "orders")


def test_a_snapshot_copies_only_what_the_streams_pipeline_lets_through(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """A `$match` that leaves a collection out (or some documents) leaves them out of the copy
    too: the stream never sees their changes, so rows copied from them would stay in
    `current` forever, however the source changes."""
    db = client[db_name]
    db.orders.insert_many([{"_id": k, "state": "open" if k % 3 else "closed"} for k in range(9)])
    db.audit.insert_many([{"_id": k, "state": "open"} for k in range(5)])
    stream = make_stream(
        collection=None,
        start="snapshot",
        snapshot_chunk_size=4,
        pipeline=[{"$match": {"ns.coll": "orders", "fullDocument.state": {"$ne": "closed"}}}],
    )
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    copied = [
        (row["coll"], row["document_key"])
        for batch in sqlite_store.batches(stream.name, source="snapshot")
        for f in batch.files
        for row in pq.read_table(lake / f.path).to_pylist()
        if row["operation_type"] == "snapshot"
    ]
    assert sorted(copied) == sorted(
        ("orders", canonical(bson.encode({"_id": k}))) for k in [1, 2, 4, 5, 7, 8]
    )
    db.audit.delete_many({})  # the stream never sees these deletes
    db.orders.insert_one({"_id": 100, "state": "open"})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    rows = read_current(spark, sqlite_store, lake, stream.name).collect()
    assert {(r._tm_coll, r._tm_key) for r in rows} == {
        ("orders", canonical(bson.encode({"_id": k}))) for k in [1, 2, 4, 5, 7, 8, 100]
    }


def test_a_snapshot_taken_right_after_a_rename_keeps_the_renamed_collection(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """The snapshot's time T is the newest operation when it begins; when that is a rename,
    the copy already holds its result, and the change stream from T must not fold it again
    (it would clear the target's copied rows and move none)."""
    db = client[db_name]
    db.a.insert_many([{"_id": k} for k in range(5)])
    db.a.rename("b")  # the newest operation: the snapshot's T
    stream = make_stream(collection=None, start="snapshot")
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    rows = read_current(spark, sqlite_store, lake, stream.name).collect()
    got = {(r._tm_coll, r._tm_key) for r in rows}
    assert got == {("b", key) for key in source_state(raw_client, db_name, "b")}
    assert len(got) == 5


def test_a_rename_during_a_database_snapshots_copy_keeps_current_equal_to_the_source(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """The copy reads collections by name long after T: one renamed before its copy ended
    is read in part, or another collection renamed onto its name is read in its stead, and
    the rename event moves only the rows copied. The copy is begun afresh."""
    db = client[db_name]
    db.a.insert_many([{"_id": k, "v": "a"} for k in range(10)])
    db.x.insert_many([{"_id": k, "v": "x"} for k in range(100, 110)])
    stream = make_stream(collection=None, start="snapshot", snapshot_chunk_size=4)
    renamed = []

    def rename_once(snapshot) -> None:
        if not renamed:  # one chunk of a copied: a's other documents and all of x's are not
            renamed.append(snapshot.chunks)
            db.a.rename("c")
            db.x.rename("a")

    drain(stream, raw_client, sqlite_store, lake, seams=DrainSeams(after_chunk=rename_once))
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    first, second = sqlite_store.snapshots(stream.name)
    assert (first.status, second.status) == ("superseded", "done")
    transform(spark, sqlite_store, lake, stream)
    rows = exact_documents(spark, sqlite_store, lake, stream.name).collect()
    got = {(r._tm_coll, r._tm_key): r._tm_document for r in rows}
    want = {
        (coll, key): doc
        for coll in ("a", "c")
        for key, doc in source_state(raw_client, db_name, coll).items()
    }
    assert got == want


def test_chunks_are_bounded_by_bytes_as_well_as_by_count(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": k, "pad": "x" * 300_000} for k in range(10)])
    coll.insert_one({"_id": 100, "pad": "y" * 1_500_000})  # larger than the bound: alone
    coll.insert_many([{"_id": 200 + k} for k in range(5)])
    stream = make_stream(start="snapshot", snapshot_chunk_size=1000, snapshot_chunk_bytes=1_000_000)
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    chunks = _snapshot_rows(sqlite_store, lake, stream.name)
    # 3 x 300 KB fit in 1 MB, a fourth does not; the 1.5 MB document is a chunk of its own.
    assert [len(chunk) for chunk in chunks] == [3, 3, 3, 1, 1, 5]
    (snapshot,) = sqlite_store.snapshots(stream.name)
    assert snapshot.status == "done" and snapshot.chunks == 6 and snapshot.documents == 16
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == _raw_source_state(raw_client, db_name, "orders")


def test_ids_and_fields_with_dates_outside_pythons_range_are_copied_and_resumed(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    in_range = [datetime(1, 1, 1, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC)]
    docs = [{"_id": d, "also": _FAR_DATES[-1 - n]} for n, d in enumerate(_FAR_DATES)]
    docs += [{"_id": d, "when": _FAR_DATES[0]} for d in in_range]
    docs += [{"_id": MaxKey(), "when": _FAR_DATES[1]}, {"_id": 1}]
    client[db_name]["orders"].insert_many(docs)
    stream = make_stream(start="snapshot", snapshot_chunk_size=2)
    # In _id order numbers come before dates: the first chunk is 1 and -2**62 ms, so the
    # position stored after it is a date Python cannot hold.
    with pytest.raises(_Crash):
        drain(stream, raw_client, sqlite_store, lake, seams=DrainSeams(after_chunk=_crash_after(1)))
    (crashed,) = sqlite_store.snapshots(stream.name)
    assert crashed.documents == 2
    assert bsonjs.loads(crashed.last_key) == bson.encode({"_id": _FAR_DATES[0]})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_one({"_id": DatetimeMS(-(2**61)), "late": True})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == _raw_source_state(raw_client, db_name, "orders")
    assert len(got) == len(docs) + 1


def test_a_position_stored_by_an_earlier_version_resumes(client, raw_client, db_name):
    """Snapshots left running by the json_util-based copy: their last_key still reads back
    to the same BSON, and one stopped at a MaxKey _id (whose min() the server refuses) ends."""
    for value in (5, Int64(2**40), -0.0, "ü", ObjectId(), MinKey(), {"a": [1]}, Timestamp(5, 6)):
        text = json_util.dumps({"_id": value}, json_options=CANONICAL)
        assert key_from_text(text) == bson.encode({"_id": value})
    client[db_name]["orders"].insert_many([{"_id": 1}, {"_id": MaxKey()}])
    database = raw_client.get_database(db_name)
    after_max = key_from_text(json_util.dumps({"_id": MaxKey()}, json_options=CANONICAL))
    chunk = read_chunk(database, "orders", after_max, 10, 1 << 20)
    assert chunk.finished and chunk.rows == []
    chunk = read_chunk(database, "orders", bson.encode({"_id": 1}), 10, 1 << 20)
    assert chunk.finished and [key for key, _ in chunk.rows] == [bson.encode({"_id": MaxKey()})]


def test_the_snapshots_own_time_stays_the_position_until_the_stream_passes_it(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """T lies just after the newest operation: a stream opened there on an idle server answers
    with a high-water mark at T itself, which does not cover an event at T still to come
    (the server resumes before one), so it is never stored as the position."""
    client[db_name]["orders"].insert_many([{"_id": k} for k in range(3)])
    stream = make_stream(start="snapshot")
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)  # the copy, then the stream
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)  # nothing new
    snapshot = sqlite_store.snapshots(stream.name)[-1]
    checkpoint = sqlite_store.checkpoint(stream.name)
    assert checkpoint is not None
    if checkpoint.token is None:
        assert checkpoint.start_at_operation_time == snapshot.cluster_time
    else:  # the server's periodic no-op went past T: a mark at an operation's time
        assert checkpoint.token.cluster_time != snapshot.cluster_time
