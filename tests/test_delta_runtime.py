"""Delta Lake on Tidemark's Spark, for real: the jars `make install` put in the venv (and only
those: no download, no second copy of a class Spark ships), a classic session and the local
Connect server that write a Delta table with deletion vectors and Change Data Feed on, MERGE an
upsert and a delete into it, read the change feed, and `deltalake` (delta-rs, no JVM) reading
the same rows.

The Connect client runs in a subprocess, as in tests/test_spark_server.py: a Connect session
switches its whole process to Connect mode.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from resources.delta import (
    AWS_SDK_VERSION,
    CATALOG,
    DELTA_VERSION,
    SQL_EXTENSION,
    coordinates,
    delta_jvm_settings,
    installed_jars,
)
from resources.processes import free_port

ROOT = Path(__file__).resolve().parent.parent

PROPERTIES = "'delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true'"
# 40 rows, then one MERGE: id 1 updated, id 2 deleted, id 100 inserted.
SOURCE_ROWS = [(1, "one", "upsert"), (2, None, "delete"), (100, "hundred", "upsert")]
EXPECTED = sorted(
    [{"id": i, "name": f"n{i}"} for i in range(40) if i not in (1, 2)]
    + [{"id": 1, "name": "one"}, {"id": 100, "name": "hundred"}],
    key=lambda row: row["id"],
)
EXPECTED_CHANGES = sorted(
    [
        (1, "n1", "update_preimage"),
        (1, "one", "update_postimage"),
        (2, "n2", "delete"),
        (100, "hundred", "insert"),
    ]
)
MERGE_SQL = """
MERGE INTO delta.`{path}` AS t USING source AS s ON t.id = s.id
WHEN MATCHED AND s.op = 'delete' THEN DELETE
WHEN MATCHED THEN UPDATE SET name = s.name
WHEN NOT MATCHED THEN INSERT (id, name) VALUES (s.id, s.name)
"""


def read_without_jvm(path: Path) -> list[dict]:
    """The table's live rows as delta-rs sees them. Its DataFusion reader applies deletion
    vectors; `DeltaTable.to_pyarrow_table()` (the pyarrow dataset path) refuses such tables."""
    from deltalake import DeltaTable, QueryBuilder

    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT id, name FROM t")
    return sorted(pa.table(reader.read_all()).to_pylist(), key=lambda row: row["id"])


def jar_paths(setting: str) -> list[str]:
    # spark-submit (the Connect server's launcher) rewrites the paths as file: URIs
    return [jar.removeprefix("file://") for jar in setting.split(",")]


def _fetch_script():
    spec = importlib.util.spec_from_file_location("fetch", ROOT / "scripts/fetch_delta_jars.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.fast
def test_sessions_load_the_venvs_jars_and_download_only_without_them(tmp_path: Path) -> None:
    installed = delta_jvm_settings()
    assert installed["spark.sql.extensions"] == SQL_EXTENSION
    assert installed["spark.sql.catalog.spark_catalog"] == CATALOG
    assert installed["spark.jars"] == ",".join(str(jar) for jar in installed_jars())
    assert "spark.jars.packages" not in installed  # nothing downloads at run time

    bare = delta_jvm_settings(prefix=tmp_path)  # a Python without `make install`'s jars
    assert "spark.jars" not in bare
    assert bare["spark.jars.packages"] == ",".join(coordinates())
    assert bare["spark.jars.excludes"] == "software.amazon.awssdk:bundle"  # 686 MB
    assert coordinates() == [
        f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}",
        f"io.delta:delta-storage:{DELTA_VERSION}",
        "org.apache.hadoop:hadoop-aws:3.5.0",  # the wheel's own Hadoop
        f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
        f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
        f"software.amazon.awssdk:sts:{AWS_SDK_VERSION}",
    ]


@pytest.mark.fast
def test_the_venvs_delta_jars_repeat_no_class_the_pyspark_wheel_ships() -> None:
    jars = installed_jars()
    names = {jar.name for jar in jars}
    assert {
        f"delta-spark_4.2_2.13-{DELTA_VERSION}.jar",
        f"delta-storage-{DELTA_VERSION}.jar",
        "hadoop-aws-3.5.0.jar",
        f"s3-{AWS_SDK_VERSION}.jar",
    } <= names, f"run make install ({names})"
    fetch = _fetch_script()
    provided = fetch.spark_classes()
    repeated = {jar.name: sorted(fetch.classes(jar) & provided)[:3] for jar in jars}
    assert {name: found for name, found in repeated.items() if found} == {}


@pytest.mark.fast
def test_a_connect_server_started_without_delta_is_not_reused() -> None:
    import pyspark

    from resources.spark_server import ConnectServer, _check_same_code
    from tidemark.errors import SparkServerError

    saved = {
        "port": 1,
        "pid": 1,
        "log": "x.out",
        "driver_memory": "1g",
        "python": sys.executable,
        "pyspark": pyspark.__version__,
        "project": str(ROOT),
    }  # the record a server wrote before Delta was on its classpath
    with pytest.raises(SparkServerError, match="Delta Lake none"):
        _check_same_code(ConnectServer(**saved))
    _check_same_code(ConnectServer(**saved, delta=DELTA_VERSION))


CONNECT_CLIENT = r"""
import json, os, sys
from resources.spark import SparkConfig, spark_session, stop_if_created

path, merge_sql, properties = sys.argv[1], sys.argv[2], sys.argv[3]
spark, created = spark_session(SparkConfig(remote=os.environ["TIDEMARK_SPARK_REMOTE"]))
spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, name STRING) USING delta "
          f"TBLPROPERTIES ({properties})")
spark.range(40).selectExpr("id", "concat('n', id) AS name").write.format("delta") \
    .mode("append").save(path)
source = spark.createDataFrame(json.loads(sys.argv[4]), "id BIGINT, name STRING, op STRING")
source.createOrReplaceTempView("source")
spark.sql(merge_sql.format(path=path))
merge = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
changes = spark.read.format("delta").option("readChangeFeed", "true") \
    .option("startingVersion", merge.version).load(path)
print(json.dumps({
    "operation": merge.operation,
    "metrics": merge.operationMetrics,
    "changes": sorted([r.id, r.name, r._change_type] for r in changes.collect()),
    "rows": sorted([r.id, r.name] for r in spark.read.format("delta").load(path).collect()),
    "jars": spark.conf.get("spark.jars"),
    "packages": spark.conf.get("spark.jars.packages", None),
}))
stop_if_created(spark, created)
"""


@pytest.mark.slow
@pytest.mark.own_servers
def test_a_connect_server_writes_and_merges_delta(tmp_path: Path) -> None:
    from resources.spark_server import start_server, stop_server

    home, table = tmp_path / "home", tmp_path / "table"
    server, fresh = start_server(home, port=free_port(), driver_memory="1g")
    assert fresh and server.delta == DELTA_VERSION
    try:
        done = subprocess.run(
            [
                sys.executable, "-c", CONNECT_CLIENT,
                str(table), MERGE_SQL, PROPERTIES, json.dumps(SOURCE_ROWS),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "TIDEMARK_SPARK_REMOTE": server.url},
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
    finally:
        stop_server(home)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["operation"] == "MERGE"
    assert int(result["metrics"]["numTargetDeletionVectorsAdded"]) >= 1
    assert result["metrics"]["numTargetFilesRemoved"] == "0"  # no file rewritten
    assert [tuple(change) for change in result["changes"]] == EXPECTED_CHANGES
    assert [{"id": i, "name": n} for i, n in result["rows"]] == EXPECTED
    assert read_without_jvm(table) == EXPECTED
    # The server loaded the venv's jars; it asked Maven for nothing.
    assert jar_paths(result["jars"]) == [str(jar) for jar in installed_jars()]
    assert result["packages"] in (None, "")


@pytest.mark.slow
def test_a_classic_session_writes_merges_and_reads_the_change_feed(spark, tmp_path: Path):
    from delta.tables import DeltaTable

    path = str(tmp_path / "table")
    assert jar_paths(spark.conf.get("spark.jars")) == [str(jar) for jar in installed_jars()]
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, name STRING) USING delta "
              f"TBLPROPERTIES ({PROPERTIES})")  # fmt: skip
    spark.range(40).selectExpr("id", "concat('n', id) AS name").write.format("delta").mode(
        "append"
    ).save(path)
    source = spark.createDataFrame(SOURCE_ROWS, "id BIGINT, name STRING, op STRING")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.op = 'delete'")
        .whenMatchedUpdate(set={"name": "s.name"})
        .whenNotMatchedInsert(values={"id": "s.id", "name": "s.name"})
        .execute()
    )

    merge = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
    assert merge.operation == "MERGE"
    assert int(merge.operationMetrics["numTargetDeletionVectorsAdded"]) >= 1
    assert merge.operationMetrics["numTargetFilesRemoved"] == "0"
    feed = spark.read.format("delta").option("readChangeFeed", "true")
    feed = feed.option("startingVersion", merge.version).load(path)
    assert sorted((r.id, r.name, r._change_type) for r in feed.collect()) == EXPECTED_CHANGES
    by_sql = spark.sql(f"SELECT * FROM table_changes('delta.`{path}`', {merge.version})")
    assert sorted((r.id, r.name, r._change_type) for r in by_sql.collect()) == EXPECTED_CHANGES

    rows = spark.read.format("delta").load(path).collect()
    assert sorted(({"id": r.id, "name": r.name} for r in rows), key=lambda r: r["id"]) == EXPECTED
    assert read_without_jvm(Path(path)) == EXPECTED
