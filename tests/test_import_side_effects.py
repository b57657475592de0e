"""Importing Tidemark's modules touches nothing of Spark's: no UDF is made, no JVM or session
starts, so import order cannot fix a UDF's Spark mode (`jobs.transform.udfs`). The UDFs'
bodies are plain functions of pyarrow arrays, tested here without Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bson
import pyarrow as pa
import pytest

from jobs import curated_zone
from jobs.raw_zone import document_json
from jobs.transform.change_log import document_json_arrays
from jobs.transform.field_census import column_names
from jobs.transform.fold import id_key, id_key_arrays

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent

# In a fresh process, classic mode: count the UDF objects PySpark makes (arrow_udf, pandas_udf
# and udf all make a UserDefinedFunction) while every module of `jobs` and `orchestration` is
# imported, then say whether any Spark machinery started.
PROBE = """
import importlib, json, pkgutil
import pyspark.sql.udf
made = []
init = pyspark.sql.udf.UserDefinedFunction.__init__
def counted(self, func, *args, **kwargs):
    made.append(getattr(func, "__name__", repr(func)))
    init(self, func, *args, **kwargs)
pyspark.sql.udf.UserDefinedFunction.__init__ = counted
import jobs, orchestration
modules = [
    m.name
    for package in (jobs, orchestration)
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
]
for name in modules:
    importlib.import_module(name)
from pyspark import SparkContext
from pyspark.sql import SparkSession
print(json.dumps({
    "modules": len(modules),
    "udfs": made,
    "context": SparkContext._active_spark_context is not None,
    "jvm": SparkContext._gateway is not None,
    "session": SparkSession._instantiatedSession is not None,
}))
"""


def test_importing_every_module_makes_no_udf_and_starts_no_spark(tmp_path: Path) -> None:
    spark_mode = ("SPARK_CONNECT_MODE_ENABLED", "TIDEMARK_SPARK_REMOTE", "TIDEMARK_SPARK_MASTER")
    env = {k: v for k, v in os.environ.items() if k not in spark_mode}
    # The code location reads its streams file and state store at import: none here.
    env.update(
        TIDEMARK_CONFIG=str(tmp_path / "streams.yaml"),
        TIDEMARK_HOME=str(tmp_path / "home"),
        TIDEMARK_STATE_URL=f"sqlite:///{tmp_path / 'state.db'}",
        TIDEMARK_LAKE=str(tmp_path / "lake"),
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["modules"] > 40  # every module was imported, not an empty walk
    assert found["udfs"] == []
    assert (found["context"], found["jvm"], found["session"]) == (False, False, False)


def _events() -> list[bytes]:
    return [
        bson.encode({"operationType": "insert", "fullDocument": {"_id": 1, "n": 2.5}}),
        bson.encode({"operationType": "update", "fullDocument": None, "documentKey": {"_id": 2}}),
        bson.encode({"operationType": "drop", "operationDescription": {"a": 1}}),
    ]


def test_the_udf_bodies_run_on_pyarrow_arrays_without_spark() -> None:
    events = _events()
    raw = pa.array(events, pa.binary())
    canonical = [document_json(e) for e in events]
    assert [tuple(r.values()) for r in document_json_arrays(raw).to_pylist()] == canonical
    keys = ['{ "_id" : 1, "shard" : "a" }', None]
    assert id_key_arrays(pa.array(keys, pa.string())).to_pylist() == [id_key(k) for k in keys]


def test_tidemark_s_own_columns_share_the_prefix_no_document_column_takes() -> None:
    own = [v for k, v in vars(curated_zone).items() if k.startswith("TM_")]
    assert len(own) == 9 and all(name.startswith(curated_zone.OWN_PREFIX) for name in own)
    assert column_names(dict.fromkeys([*own, "_TM_KEY", "n"], 1)) == ["n"]
