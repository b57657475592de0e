"""Delta Lake (and s3a) on Tidemark's Spark: the one place that names their versions, where
their jars live, and the settings that load them into a driver JVM (a classic session's or the
Connect server's).

`make install` fetches the jars once into the venv (`scripts/fetch_delta_jars.py`, which reads
the versions from here), so a session or test never downloads: `spark.jars` names them. Only a
Python environment without them (a plain `pip install`) falls back to `spark.jars.packages`,
which downloads the same coordinates from Maven Central when the JVM starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

# delta-spark 4.4.x (PyPI) accepts pyspark <= 4.2.0; 4.4.1's jars are not on Maven Central yet
# (checked 2026-11-24), so both the wheel and the jars are 4.4.0. pyproject.toml pins the same.
DELTA_VERSION = "4.4.0"
SCALA_BINARY = "2.13"
SQL_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# s3a, for a lake on object storage: hadoop-aws at the pyspark wheel's own Hadoop version (its
# classes must match hadoop-client-api's), and the AWS SDK v2 modules S3A uses at the version
# that hadoop-aws release declares for its SDK bundle (which is 686 MB; these are 13 MB).
AWS_SDK_VERSION = "2.35.4"
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
# Delta Connect's server plugin (io.delta:delta-connect-server_<spark>_2.13, classes
# io.delta.connect.server.Delta{Relation,Command}Plugin) is not served for 4.4.0: without it a
# Connect client reaches Delta through SQL (MERGE INTO delta.`path`), not `DeltaTable`.


def spark_binary() -> str:
    """The installed pyspark's major.minor, which names Delta's jar (delta-spark_4.2_2.13)."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return f"{major}.{minor}"


def hadoop_version() -> str:
    """The Hadoop the pyspark wheel ships (its hadoop-client-api jar), which hadoop-aws matches."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not found:
        raise RuntimeError(f"No hadoop-client-api jar in {jars}: is pyspark installed whole?")
    return found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def coordinates() -> list[str]:
    """The Maven coordinates for this Spark (the fallback's `spark.jars.packages`)."""
    return [
        f"io.delta:delta-spark_{spark_binary()}_{SCALA_BINARY}:{DELTA_VERSION}",
        f"io.delta:delta-storage:{DELTA_VERSION}",
        f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
    ] + [f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}" for module in AWS_SDK_MODULES]


def jars_dir(prefix: Path | None = None) -> Path:
    """Where `make install` puts the jars: in the venv, named by Delta's and Spark's versions
    so that a new pin never reuses the old jars."""
    root = Path(prefix or sys.prefix)
    name = f"delta-{DELTA_VERSION}-spark-{spark_binary()}-s3a-{hadoop_version()}"
    return root / "jars" / name


def installed_jars(prefix: Path | None = None) -> list[Path]:
    """The venv's Delta jars, or [] when `make install` has not fetched them (the directory
    appears whole: the fetch renames it into place last)."""
    directory = jars_dir(prefix)
    return sorted(directory.glob("*.jar")) if directory.is_dir() else []


def delta_jvm_settings(prefix: Path | None = None) -> dict[str, str]:
    """What a driver JVM needs to read and write Delta tables: the jars, Delta's SQL extension
    (MERGE, OPTIMIZE, VACUUM, table_changes) and its catalog. All are fixed when the JVM
    starts; a Connect server refuses them from a client."""
    jars = installed_jars(prefix)
    settings = {"spark.sql.extensions": SQL_EXTENSION, "spark.sql.catalog.spark_catalog": CATALOG}
    if jars:
        settings["spark.jars"] = ",".join(str(jar) for jar in jars)
    else:
        settings["spark.jars.packages"] = ",".join(coordinates())
        settings["spark.jars.excludes"] = "software.amazon.awssdk:bundle"
    return settings
