"""The long-lived Spark Connect server, for real: started under a temporary Tidemark home on a
free port, queried by a Connect client in a fresh process (whose pandas UDF must run in this
venv's Python), a transform over it whose tables delta-rs reads, restarted idempotently,
stopped, and a start that cannot bind its port.

The clients run in subprocesses: a Connect session switches its whole process to Connect mode
(SPARK_CONNECT_MODE_ENABLED), which would turn the rest of the suite's local sessions remote.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from bson import ObjectId

from jobs.capture import drain
from resources.processes import free_port
from resources.spark_server import (
    CONNECT_CLASS,
    ConnectServer,
    running_server,
    start_server,
    stop_server,
)
from tests.helpers.connect_transform import transform_over_connect
from tests.helpers.delta_reading import current_documents, current_tables, query
from tests.helpers.oracle import source_state
from tidemark.cli.commands import main
from tidemark.errors import SparkServerError

pytestmark = [pytest.mark.slow, pytest.mark.own_servers]

ROOT = Path(__file__).resolve().parent.parent

CLIENT = r"""
import json, os, sys, warnings
from resources.spark import SparkConfig, spark_session, stop_if_created

url = os.environ["TIDEMARK_SPARK_REMOTE"]
import orchestration  # as in a Dagster run: announces the remote before any UDF is defined

import pandas as pd
from pyspark import SparkContext
from pyspark.sql import functions as F
from pyspark.sql.types import StringType


@F.pandas_udf(StringType())
def worker_python(ids: pd.Series) -> pd.Series:
    import bsonjs  # in Tidemark's venv only: proves where the server's Python workers run

    return ids.map(lambda _: f"{sys.executable} {bsonjs.__name__}")


with warnings.catch_warnings(record=True) as refused:  # PySpark warns of a refused setting
    warnings.simplefilter("always")
    spark, created = spark_session(SparkConfig(remote=url))
rows = spark.range(5).select(worker_python(F.col("id").cast("string")).alias("py")).collect()
print(json.dumps({
    "created": created,
    "sum": spark.range(1000).selectExpr("sum(id) AS s").collect()[0].s,
    "workers": sorted({r.py for r in rows}),
    "time_zone": spark.conf.get("spark.sql.session.timeZone"),
    "case_sensitive": spark.conf.get("spark.sql.caseSensitive"),
    "refused": [str(w.message)[:200] for w in refused if "Failed to set" in str(w.message)],
    "local_jvm": SparkContext._gateway is not None,
}))
stop_if_created(spark, created)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ConnectServer]]:
    home = tmp_path_factory.mktemp("tidemark-home")
    started, fresh = start_server(home, port=free_port(), driver_memory="1g")
    assert fresh
    try:
        yield home, started
    finally:
        stop_server(home)  # the tests stop it too; this is for when one fails first


def _client(url: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TIDEMARK_SPARK_REMOTE": url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_connect_client_runs_queries_and_venv_python_udfs(server) -> None:
    home, started = server
    # Waiting for the server asked it a query, without switching this process to Connect.
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    assert started.url == f"sc://127.0.0.1:{started.port}"
    assert Path(started.log).is_relative_to(home) and Path(started.log).exists()

    result = _client(started.url)
    assert result["created"] and result["sum"] == 499_500
    assert result["workers"] == [f"{sys.executable} bsonjs"]
    assert (result["time_zone"], result["case_sensitive"]) == ("UTC", "true")
    assert result["refused"] == []  # no JVM-only setting (spark.ui.*, driver) was sent
    assert result["local_jvm"] is False


def test_the_tables_a_transform_writes_over_connect_are_read_by_delta_rs(
    server, client, raw_client, sqlite_store, lake, make_stream, db_name
) -> None:
    """Over Spark Connect, a Python UDF's strings came back typed `string collate
    UTF8_BINARY`. Delta wrote that type into the schemas of the tables the CLI and Dagster
    make (both use the local Connect server), and delta-rs refused to read any of them
    (`Unsupported Delta table type`). Keys of every kind, the Python path of a string `_id`
    included."""
    _, started = server
    stream = make_stream()
    orders = client[db_name]["orders"]
    drain(stream, raw_client, sqlite_store, lake)  # the stream starts here
    orders.insert_many(
        [
            {"_id": 1, "a": {"b": 1}},
            {"_id": "k", "a": {"b": 2}},
            {"_id": ObjectId(), "s": "x"},
            {"_id": {"x": 1}, "s": "y"},
        ]
    )
    orders.update_one({"_id": "k"}, {"$set": {"a.c": [1, 2]}})
    orders.delete_one({"_id": 1})
    drain(stream, raw_client, sqlite_store, lake)

    assert transform_over_connect(started.url, sqlite_store, lake, stream)["added"] == 6
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    tables = sqlite_store.transforms.tables(stream.name)
    assert sorted(t.kind for t in tables) == ["changes", "current"]
    for table in tables:  # every column of every table
        assert query(lake / table.path, "SELECT * FROM t"), table.path


def test_start_is_idempotent_and_the_cli_reports_and_stops_it(server, monkeypatch, capsys):
    home, started = server
    monkeypatch.setenv("TIDEMARK_HOME", str(home))

    assert main(["spark", "status"]) == 0
    status = capsys.readouterr().out
    assert "running" in status and started.url in status and str(started.pid) in status
    assert started.log in status

    assert main(["spark", "start"]) == 0
    assert f"already running at {started.url}" in capsys.readouterr().out
    assert start_server(home) == (started, False)

    assert main(["spark", "stop"]) == 0
    assert "stopped" in capsys.readouterr().out
    assert running_server(home) is None
    cmdline = Path(f"/proc/{started.pid}/cmdline")
    assert not cmdline.exists() or CONNECT_CLASS.encode() not in cmdline.read_bytes()
    assert main(["spark", "status"]) == 1
    assert "not running" in capsys.readouterr().out


def test_a_start_on_a_taken_port_fails_with_the_log_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SparkServerError) as failure:
            start_server(tmp_path, port=port, timeout=90)
    message = str(failure.value)
    logs = list((tmp_path / "spark" / "logs").glob("*.out"))
    assert len(logs) == 1 and str(logs[0]) in message
    assert f"Port {port}" in message and "--port" in message
    assert running_server(tmp_path) is None
