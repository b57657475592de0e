"""The SparkSession: built from config, quiet, UTC, one per process.

`spark_session()` returns the process's session and whether this call created it; only the
creator stops it (`stop_if_created`), so a test suite or a Dagster run sharing the session is
never cut off by a helper that merely used it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tidemark.errors import SparkUnavailable

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""
JAVA_HINT = (
    "Install Java 17 or 21 (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless) "
    "or set JAVA_HOME to one."
)


class SparkConfig(BaseModel):
    """How to reach Spark: a local master by default, a cluster master or a Connect remote."""

    master: str = "local[*]"
    remote: str | None = None  # Spark Connect, e.g. sc://host:15002
    app_name: str = "tidemark"
    driver_memory: str = "2g"
    shuffle_partitions: int = 4
    conf: dict[str, str] = Field(default_factory=dict)


def java_binary() -> Path:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else None
    if java is None:
        found = shutil.which("java")
        java = Path(found) if found else None
    if java is None or not java.exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on the PATH"
        raise SparkUnavailable(
            f"Spark needs Java 17 or 21, and none was found ({where}).", JAVA_HINT
        )
    return java


def java_major(java: Path) -> int | None:
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return int(match.group(1)) if match else None


def check_java() -> Path:
    java = java_binary()
    major = java_major(java)
    if major not in (17, 21):
        raise SparkUnavailable(
            f"Spark 4 needs Java 17 or 21; {java} is Java {major or 'of unknown version'}.",
            JAVA_HINT,
        )
    return java


def _conf_dir() -> str:
    """A SPARK_CONF_DIR whose log4j2 config is at level error, so Spark starts quietly."""
    directory = Path(tempfile.gettempdir()) / "tidemark-spark-conf"
    directory.mkdir(exist_ok=True)
    target = directory / "log4j2.properties"
    if not target.exists() or target.read_text() != _LOG4J:
        target.write_text(_LOG4J)
    return str(directory)


def spark_session(config: SparkConfig | None = None) -> tuple[Any, bool]:
    """The process's SparkSession and whether this call created it."""
    from pyspark.sql import SparkSession  # heavy import, only where Spark is used

    config = config or SparkConfig()
    try:
        # Active for this thread or the process's default: getActiveSession() alone is
        # thread-local and would miss a session another thread started.
        return SparkSession.active(), False
    except Exception:  # PySparkRuntimeError NO_ACTIVE_OR_DEFAULT_SESSION
        pass
    builder = SparkSession.builder.appName(config.app_name)
    settings: dict[str, str] = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.caseSensitive": "true",  # MongoDB field names are case-sensitive
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **config.conf,
    }
    if config.remote:
        builder = builder.remote(config.remote)
    else:
        check_java()
        os.environ.setdefault("SPARK_CONF_DIR", _conf_dir())
        # Python UDF workers must run this interpreter (its venv has pandas, bsonjs, ...).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if config.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
            settings.setdefault("spark.driver.host", "127.0.0.1")
        settings["spark.driver.memory"] = config.driver_memory  # only honoured before the JVM
        builder = builder.master(config.master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # py4j and Connect raise many kinds; all mean "no Spark"
        raise SparkUnavailable(
            f"Spark did not start ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}).",
            f"Check the Spark settings (master {config.master!r}"
            + (f", remote {config.remote!r}" if config.remote else "")
            + f"). {JAVA_HINT}",
        ) from None
    return session, True


def stop_if_created(session: Any, created: bool) -> None:
    if created:
        session.stop()
