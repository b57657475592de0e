"""The driver JVM's class-data-sharing archive: Spark's and Delta's classes, parsed and verified
once at `make install`, mapped by every Spark driver JVM this machine starts after that.

A Spark driver loads its classes from ~320 jars (the wheel's 277, Delta's 46) as its first
queries need them; a short run (a scheduled run with a JVM of its own, a CLI command, a test's
child process) spends much of its CPU there. Measured here (a session, one Delta write and one
MERGE, `-XX:TieredStopAtLevel=1`): 28 CPU-s and 23 s without the archive, 19 CPU-s and 15 s
with it (`benchmarks/jvm_start.py`).

The archive is a dynamic one (`-XX:ArchiveClassesAtExit`, JDK 13+), written by a training run
(`python -m resources.jvm_archive`) that exercises what the transform uses: Delta writes, a
MERGE with schema evolution, the change feed, a Python UDF. The JVM checks on each start that
its own build and class path match the archive's and silently does without it when they do
not (a new JDK, another jar list, a SPARK_CONF_DIR of the user's with files in it: the JVM
refuses a class path with a non-empty directory): it is a cache, never a requirement.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from resources.delta import jars_dir

ARCHIVE_NAME = "spark-driver-classes.jsa"
# `-Xlog:cds...=off`: a JVM that cannot use the archive says so on its console; it is a cache.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path(prefix: Path | None = None) -> Path:
    """Where `make install` writes the archive: beside the Delta jars it was trained with."""
    return jars_dir(prefix).parent / ARCHIVE_NAME


def archive_options(prefix: Path | None = None) -> str:
    """The driver JVM options that map the archive, or "" when none was built."""
    path = archive_path(prefix)
    return f"-XX:SharedArchiveFile={path} {_QUIET}" if path.is_file() else ""


def build(prefix: Path | None = None) -> Path | None:
    """Train a driver JVM and keep its archive (replacing an older one whole); its path, or
    None when the training failed (then no archive is left)."""
    target = archive_path(prefix)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_suffix(".jsa.part")
    staged.unlink(missing_ok=True)
    # The training JVM must not map the old archive: it would be taken for a base archive.
    target.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "resources.jvm_archive", "--train", str(staged)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not staged.is_file():
        # A cache: without it every JVM still starts, only slower.
        print(
            "The Spark driver's class archive was not built (JVMs start without it): "
            + " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:]),
            file=sys.stderr,
        )
        staged.unlink(missing_ok=True)
        return None
    staged.replace(target)
    return target


def _train(archive: Path) -> None:
    """One short session doing what a transform does; the JVM writes the archive at its exit."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    from resources.spark import SparkConfig, spark_session

    options = f"-XX:ArchiveClassesAtExit={archive} {_QUIET}"
    spark, _ = spark_session(SparkConfig(master="local[2]", java_options=options))

    @pandas_udf("string")
    def upper(values):  # a Python UDF: Arrow and the Python worker's classes
        return values.str.upper()

    with tempfile.TemporaryDirectory() as scratch:
        table = f"{scratch}/t"
        rows = spark.range(20).select(
            F.col("id"), F.col("id").cast("string").alias("s"), F.current_timestamp().alias("t")
        )
        rows.write.format("delta").option("delta.enableChangeDataFeed", "true").save(table)
        source = spark.range(10, 30).select(
            F.col("id"), upper(F.col("id").cast("string")).alias("s"), F.lit(1).alias("extra")
        )
        source.localCheckpoint().createOrReplaceTempView("source")
        spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
        spark.sql(
            f"MERGE INTO delta.`{table}` t USING source s ON t.id = s.id "
            "WHEN MATCHED AND s.id > 25 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT *"
        )
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id < 3")
        spark.read.format("delta").option("readChangeFeed", "true").option(
            "startingVersion", 0
        ).load(table).groupBy("_change_type").count().collect()
        spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").collect()
        spark.read.format("delta").load(table).where("id > 5").orderBy("id").collect()
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        _train(Path(sys.argv[2]))
    elif (built := build()) is not None:
        print(built)
