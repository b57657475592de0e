"""Progress of long work: a drain, a re-snapshot and a transform report what they did so far
to the callback they are given, ending at their true totals."""

from __future__ import annotations

import pytest

from jobs.capture import drain
from jobs.progress import Meter, Progress, describe
from jobs.transform import transform


def assert_counts_up_to(reports: list[Progress], total: int) -> None:
    done = [r.done for r in reports]
    assert done == sorted(done), f"counts went back: {done}"
    assert reports[-1].final and reports[-1].done == total, reports[-1]
    assert not any(r.final for r in reports[:-1])


def test_a_drain_reports_its_events_up_to_the_total(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(batch_size=40)
    drain(stream, raw_client, sqlite_store, lake)  # takes the starting position
    client[db_name]["orders"].insert_many([{"i": i} for i in range(300)])
    reports: list[Progress] = []
    result = drain(stream, raw_client, sqlite_store, lake, progress=reports.append)
    assert result.events == 300
    assert_counts_up_to(reports, 300)
    assert {(r.work, r.unit) for r in reports} == {("drain", "events")}


def test_a_resnapshot_reports_documents_against_the_collections_count(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    client[db_name]["orders"].insert_many([{"i": i} for i in range(250)])
    stream = make_stream(snapshot_chunk_size=60)
    drain(stream, raw_client, sqlite_store, lake)
    reports: list[Progress] = []
    result = drain(stream, raw_client, sqlite_store, lake, resnapshot=True, progress=reports.append)
    assert result.snapshot is not None and result.snapshot.documents == 250
    copied = [r for r in reports if r.work == "snapshot"]
    assert copied[0].phase == "copy" and copied[0].done == 0
    assert {r.total for r in copied} == {250}  # the collection's estimated count
    assert_counts_up_to(copied, 250)
    # Then the drain from the snapshot's time, reported on its own.
    assert reports[-1].work == "drain" and reports[-1].final


def test_a_transform_reports_its_phases_and_the_events_it_read(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(30)])
    drain(stream, raw_client, sqlite_store, lake)
    reports: list[Progress] = []
    result = transform(spark, sqlite_store, lake, stream, progress=reports.append)
    assert result.events_read == 30
    assert [r.phase for r in reports] == ["change log", "current", "commit", "commit"]
    assert {r.total for r in reports} == {30}
    assert_counts_up_to(reports, 30)
    reports.clear()
    transform(spark, sqlite_store, lake, stream, progress=reports.append)
    assert reports == []  # nothing new: no work to report


@pytest.mark.fast
def test_a_meter_calls_back_per_interval_but_always_for_a_phase_and_the_end():
    reports: list[Progress] = []
    meter = Meter(reports.append, "orders", "snapshot", "documents", interval=float("inf"))
    for done in range(1, 10_001):  # a reply or a chunk each
        meter.count(done)
    meter.enter("copy", total=20_000)
    meter.count(15_000)
    meter.finish()
    assert [(r.phase, r.done, r.final) for r in reports] == [
        ("", 1, False),  # the first count: the work has started
        ("copy", 10_000, False),
        ("copy", 15_000, True),
    ]
    assert describe(reports[-1]).startswith("orders snapshot (copy): 15,000 / ~20,000 documents")
    Meter(None, "orders", "drain", "events").finish()  # no callback: nothing to do
