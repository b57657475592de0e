"""Tables any engine can find: DuckDB reads the newest `current` and `changes` through the
manifest alone, and a manifest a crash left stale is healed by the next run."""

from __future__ import annotations

import json
import shutil

import duckdb

from jobs.capture import drain
from jobs.catalog import MANIFEST_NAME, MANIFEST_TEMP_PREFIX, publish_if_stale
from jobs.ops.gc import sweep_curated
from jobs.transform import compact, read_changes, read_current, transform


def duckdb_current(manifest: dict) -> list[tuple]:
    """The README's recipe: the parts in order, merged by the manifest's rule, in DuckDB."""
    parts = " UNION ALL BY NAME ".join(
        f"SELECT *, {p['part']} AS part FROM read_parquet({p['files']!r}, union_by_name = true)"
        for p in manifest["parts"]
        if p["files"]
    )
    query = f"""
        SELECT _tm_key, _tm_document, qty FROM (
          SELECT *, row_number() OVER (PARTITION BY _tm_db, _tm_coll, _tm_key
                                       ORDER BY _tm_event_id DESC, part DESC) AS rn
          FROM ({parts}))
        WHERE rn = 1 AND NOT _tm_deleted"""
    return sorted(duckdb.sql(query).fetchall())


def spark_current(spark, store, lake, stream) -> list[tuple]:
    frame = read_current(spark, store, lake, stream).select("_tm_key", "_tm_document", "qty")
    return sorted(tuple(r) for r in frame.collect())


def _manifest(lake, table: str) -> dict:
    return json.loads((lake / "curated" / "orders" / table / MANIFEST_NAME).read_text())


def test_duckdb_reads_the_newest_version_through_the_manifest_alone(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    coll = client[db_name]["orders"]
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_many([{"_id": i, "qty": i} for i in range(30)])
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "base"
    coll.update_many({"_id": {"$lt": 5}}, {"$set": {"qty": 100}})
    coll.delete_many({"_id": {"$gte": 25}})
    coll.insert_many([{"_id": i, "qty": -i} for i in range(30, 34)])
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "delta"

    manifest = _manifest(lake, "current")
    assert manifest["version"] == 2 and manifest["rows"] == 29
    assert [p["kind"] for p in manifest["parts"]] == ["base", "delta"]
    assert {"name": "qty", "type": "bigint"} in manifest["schema"]
    got = duckdb_current(manifest)
    assert len(got) == 29
    assert got == spark_current(spark, sqlite_store, lake, stream.name)

    changes = _manifest(lake, "changes")
    logged = duckdb.sql(
        f"SELECT event_id FROM read_parquet({changes['files']!r}, hive_partitioning = true)"
    ).fetchall()
    expected = read_changes(spark, sqlite_store, lake, stream.name).select("event_id").collect()
    assert sorted(logged) == sorted(tuple(r) for r in expected)
    assert changes["rows"] == len(logged) == 30 + 5 + 5 + 4
    # The manifest's schema is the table's: the run files' plain JSON is named to be dropped.
    table_columns = set(read_changes(spark, sqlite_store, lake, stream.name).columns)
    file_columns = set(
        duckdb.sql(
            f"SELECT * FROM read_parquet({changes['files']!r}, hive_partitioning = true) LIMIT 0"
        ).columns
    )
    assert {c["name"] for c in changes["schema"]} == table_columns
    assert file_columns - set(changes["drop_columns"]) == table_columns

    # After a compaction the manifest names one base, and reads the same.
    assert compact(spark, sqlite_store, lake, stream).version == 3
    compacted = _manifest(lake, "current")
    assert compacted["version"] == 3 and len(compacted["parts"]) == 1
    assert duckdb_current(compacted) == got


def test_a_manifest_left_stale_by_a_crash_is_healed_by_the_next_run_or_tidemark_tables(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    coll = client[db_name]["orders"]
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_many([{"_id": i, "qty": i} for i in range(10)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    path = lake / "curated" / "orders" / "current" / MANIFEST_NAME
    shutil.copy(path, lake / "v1.json")
    coll.insert_many([{"_id": i, "qty": i} for i in range(10, 15)])
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).version == 2

    # A crash between the commit of version 2 and its manifest leaves version 1's.
    shutil.copy(lake / "v1.json", path)
    quiet = transform(lambda: None, sqlite_store, lake, stream)  # nothing new: no Spark either
    assert quiet.version is None
    assert json.loads(path.read_text())["version"] == 2

    path.unlink()  # lost altogether: `tidemark tables` writes it (under the lease)
    assert [t.table for t in publish_if_stale(sqlite_store, lake, stream.name)] == ["current"]
    healed = json.loads(path.read_text())
    assert healed["version"] == 2 and healed["rows"] == 15
    assert duckdb_current(healed) == spark_current(spark, sqlite_store, lake, stream.name)
    assert publish_if_stale(sqlite_store, lake, stream.name) == []  # up to date: no write


def test_gc_removes_a_half_written_manifest_and_keeps_the_manifest(sqlite_store, lake):
    """A crash between a manifest's temporary file and its rename leaves the temporary file;
    gc removes it (no Spark, no mongod: the curated zone laid out by hand)."""
    table = lake / "curated" / "orders" / "current"
    table.mkdir(parents=True)
    manifest = table / MANIFEST_NAME
    manifest.write_text("{}")
    half = table / f"{MANIFEST_TEMP_PREFIX}abc.tmp"
    half.write_text("{")
    swept = sweep_curated(lake, sqlite_store, "orders", min_age_seconds=0)
    assert swept.removed == ["curated/orders/current/" + half.name]
    assert manifest.exists() and not half.exists()
