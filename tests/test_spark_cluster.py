"""The transform on a real Spark standalone cluster (issue 26, item 2): a master and two
workers from the pyspark wheel, a Spark Connect server attached to the master as the driver,
the lake on a real S3 server (SeaweedFS), and executors whose Python has the libraries but not
Tidemark (tests/helpers/spark_cluster.py). Tidemark ships its own modules to each session.

A Connect session turns its whole process to Connect mode, so every Spark client here runs in a
process of its own, as the CLI's and Dagster's runs do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.capture import drain
from tests.helpers.connect_transform import transform_over_connect
from tests.helpers.delta_reading import current_documents, current_tables, query
from tests.helpers.oracle import burst, seed_collection, source_state
from tests.helpers.spark_cluster import SparkCluster, start_cluster, stop_cluster
from tests.helpers.torture import TortureConfig, run_torture

ROOT = Path(__file__).resolve().parent.parent
SECONDS = float(os.environ.get("TIDEMARK_TORTURE_SECONDS", 18))

pytestmark = [pytest.mark.slow, pytest.mark.own_servers]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    directory = tmp_path_factory.mktemp("cluster")
    home = tmp_path_factory.mktemp("cluster-home")
    running = start_cluster(directory, home)
    yield running
    stop_cluster(running, home)


WHERE_UDFS_RUN = r"""
import json, os, sys
os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
import pandas as pd
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.types import StringType

@F.pandas_udf(StringType())
def where(ids: pd.Series) -> pd.Series:
    try:
        import jobs.transform.type_rule  # Tidemark's own module, as the transform's UDFs are
        found = "tidemark"
    except ImportError as exc:
        found = f"missing: {exc}"
    return ids.map(lambda _: json.dumps([os.getcwd(), os.getppid(), sys.executable, found]))

def run(spark):
    frame = spark.range(8).repartition(4).select(where(F.col("id").cast("string")).alias("w"))
    return sorted({r.w for r in frame.collect()})

bare = SparkSession.builder.remote(sys.argv[1]).create()  # a session that ships nothing
without = run(bare)
bare.stop()
from resources.spark import SparkConfig, spark_session
spark, _ = spark_session(SparkConfig(remote=sys.argv[1]))  # Tidemark's: ships its modules
print(json.dumps({"without": without, "with": run(spark)}))
"""


def test_the_executors_are_the_workers_processes_and_import_tidemark_only_as_shipped(
    cluster: SparkCluster,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WHERE_UDFS_RUN, cluster.server.url],
        cwd="/",  # not the checkout: nothing found by accident from the working directory
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    work = tuple(str(w) for w in cluster.work_dirs)
    for key in ("without", "with"):
        rows = [json.loads(r) for r in seen[key]]
        # Executors run in the workers' own directories (work-dir/app/executor), with the
        # workers' interpreter: other processes than this test's and the server's.
        assert rows and all(cwd.startswith(work) for cwd, _, _, _ in rows), rows
        assert {os.path.basename(exe) for _, _, exe, _ in rows} <= {"python", "python3"}
    missing = {json.loads(r)[3] for r in seen["without"]}
    assert missing == {"missing: No module named 'jobs'"}, seen
    assert {json.loads(r)[3] for r in seen["with"]} == {"tidemark"}


def test_the_transform_on_the_cluster_with_the_lake_on_s3_equals_the_source(
    cluster: SparkCluster, client, raw_client, sqlite_store, s3_lake, make_stream, db_name
) -> None:
    import random

    rng = random.Random(53)
    stream = make_stream()
    lake = s3_lake
    drain(stream, raw_client, sqlite_store, lake)
    seed_collection(client, db_name, "orders", rng)
    burst(client, db_name, "orders", rng, 1500)
    drain(stream, raw_client, sqlite_store, lake)
    first = transform_over_connect(cluster.server.url, sqlite_store, lake, stream)
    burst(client, db_name, "orders", rng, 800)
    drain(stream, raw_client, sqlite_store, lake)
    second = transform_over_connect(cluster.server.url, sqlite_store, lake, stream)

    assert first["added"] > 0 and second["added"] > 0
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    assert str(path).startswith("s3://")
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    changes = [t for t in sqlite_store.transforms.tables(stream.name) if t.kind == "changes"]
    ids = [r["event_id"] for t in changes for r in query(lake / t.path, "SELECT event_id FROM t")]
    assert len(ids) == len(set(ids)) == first["added"] + second["added"]


# A cluster of four JVMs and killable client runs beside the other xdist worker: one took
# ~600 s on a loaded machine.
@pytest.mark.timeout(1800)
def test_torture_with_the_lake_on_s3_and_the_transform_on_the_cluster(
    cluster: SparkCluster, mongod, tmp_path, s3_lake
) -> None:
    """The torture at half its CI time with the lake on the S3 server and every transform and
    compaction a child process on the cluster's Connect server, SIGKILLed at random moments
    (a killed client's query may go on in the server: the Delta commits' marks and the lease
    must keep each event once). Two of the variants: a collection in small runs, and the
    cluster, whose scope holds both databases' DDL (renames, drops, a dropped database). The
    local torture runs all nine; the settle phase costs per variant (964 s with all nine,
    443 s with three in CI)."""
    cfg = TortureConfig(
        seed=8,
        write_seconds=SECONDS / 2,
        transform_in_child=True,
        spark_remote=cluster.server.url,
        streams=("ords_tiny", "cluster"),
    )
    ok, text, _ = run_torture(mongod.uri, s3_lake, f"sqlite:///{tmp_path / 'state.db'}", cfg)
    print(text)
    assert ok, text
