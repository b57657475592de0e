"""The SparkSession: built from config, quiet, UTC, one per process.

`spark_session()` returns the process's session and whether this call created it; only the
creator stops it (`stop_if_created`), so a test suite or a Dagster run sharing the session is
never cut off by a helper that merely used it. With a Spark Connect remote (`sc://...`, e.g.
the long-lived local server of `resources/spark_server.py`) no JVM starts in this process.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, Field

from resources.delta import delta_jvm_settings
from resources.jvm_archive import archive_options
from resources.spark_code import ship_code
from tidemark.errors import (
    SparkUnavailable,
)

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
REMOTE_ENV = "TIDEMARK_SPARK_REMOTE"
JAVA_OPTIONS_ENV = "TIDEMARK_SPARK_JAVA_OPTIONS"
JAVA_HINT = (
    "Install Java 17 or 21 (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless) "
    "or set JAVA_HOME to one."
)


class SparkConfig(BaseModel):
    """How to reach Spark: a local master by default, a cluster master or a Connect remote."""

    master: str = "local[*]"
    remote: str | None = None  # Spark Connect, e.g. sc://host:15002 (TIDEMARK_SPARK_REMOTE)
    app_name: str = "tidemark"
    driver_memory: str = "2g"
    shuffle_partitions: int = 4
    conf: dict[str, str] = Field(default_factory=dict)
    # Options of a driver JVM started here (TIDEMARK_SPARK_JAVA_OPTIONS by default). A short
    # run, such as a test's or a small scheduled run's, starts faster on the quick compiler
    # alone (`-XX:TieredStopAtLevel=1`): measured here, 40 % less JVM CPU for a session's start,
    # a Delta write and a MERGE. A long-lived server keeps the JVM's defaults.
    java_options: str = Field(default_factory=lambda: os.environ.get(JAVA_OPTIONS_ENV, ""))


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


def _spark_dir(name: str) -> Path:
    directory = Path(tempfile.gettempdir()) / name
    directory.mkdir(exist_ok=True)
    return directory


def _log_config() -> str:
    """A log4j2 config at level error, so Spark starts quietly; its path."""
    target = _spark_dir("tidemark-spark-log") / "log4j2.properties"
    if not target.exists() or target.read_text() != _LOG4J:
        # Several processes may start Spark at once (test workers, a UI's runs): each writes
        # a file of its own and renames it into place, so none reads a half-written config.
        staged = target.parent / f".log4j2.{os.getpid()}.{threading.get_ident()}"
        staged.write_text(_LOG4J)
        staged.replace(target)
    return str(target)


def _conf_dir() -> str:
    """An empty SPARK_CONF_DIR. Spark puts it first on the driver's class path, and a JVM maps
    its class archive (`resources.jvm_archive`) only when no directory there holds a file: the
    log config is passed by path instead (`driver_java_options`)."""
    return str(_spark_dir("tidemark-spark-conf-empty"))


def quiet_conf_dir() -> str:
    """A SPARK_CONF_DIR holding only the quiet log config, for JVMs that map no class archive
    and take no driver options: a standalone master's and worker's, and through a worker's
    environment its executors'."""
    return str(Path(_log_config()).parent)


# The quick compiler alone (`-XX:TieredStopAtLevel=1`, 2 or 3) also shrinks the JVM's code
# cache from 240 to 48 MB, which a Spark and Delta driver fills in well under a minute of runs;
# the JVM then stops compiling ("CodeCache is full. Compiler has been disabled.") and runs all
# code it meets after that interpreted. Measured here: seven small runs of a database stream
# took 175 CPU-s so, 152 with room (BENCHMARKS.md, session 55). Such a JVM keeps the tiered
# default's size.
_QUICK_COMPILER = re.compile(r"-XX:TieredStopAtLevel=[0-3](?!\d)")
QUICK_COMPILER_CODE_CACHE = "-XX:ReservedCodeCacheSize=240m"


def driver_java_options(config: SparkConfig) -> str:
    """The options of a driver JVM started here: the quiet log config, the class archive when
    `make install` built one, then the config's own, with room for compiled code when they
    choose the quick compiler alone (`QUICK_COMPILER_CODE_CACHE`)."""
    log = f"-Dlog4j2.configurationFile={_log_config()}"
    own = config.java_options
    if _QUICK_COMPILER.search(own) and "-XX:ReservedCodeCacheSize=" not in own:
        own = f"{own} {QUICK_COMPILER_CODE_CACHE}"
    return " ".join(filter(None, [log, archive_options(), own]))


def session_settings(config: SparkConfig) -> dict[str, str]:
    """The SQL settings every Tidemark session runs with, local or over Spark Connect (a
    Connect server accepts these per session)."""
    return {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.caseSensitive": "true",  # MongoDB field names are case-sensitive
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        # The partitions are already sized for the cores; adaptive coalescing judged them by
        # their compressed bytes and put a stage's whole per-row work (JSON, Parquet) in one task.
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # A write partitioned by date (the change log) keeps a file open per date a task
        # meets instead of sorting the task's rows by date first: a run spans one or two.
        "spark.sql.maxConcurrentOutputFileWriters": "4",
        # Delta rebuilds a table's file list (its snapshot) in 50 tasks by default, sized for
        # logs of millions of files: a Tidemark table's log lists a few hundred, and every
        # MERGE and read pays that job, so it gets the shuffle's partitions.
        "spark.databricks.delta.snapshotPartitions": str(config.shuffle_partitions),
        # VACUUM lists a table's directories in this many tasks (10,000 by default): a
        # VACUUM of a three-file table took 38 s.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(config.shuffle_partitions),
        **config.conf,
    }


def jvm_settings(config: SparkConfig) -> dict[str, str]:
    """The settings of a driver JVM this machine starts (a session's or the Connect server's).
    A Connect server refuses them from a client (CANNOT_MODIFY_CONFIG): they are fixed when
    its JVM starts."""
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": config.driver_memory,  # only honoured before the JVM starts
    }
    settings["spark.driver.extraJavaOptions"] = driver_java_options(config)
    if config.master.startswith("local"):
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
        # UDF workers fork from a daemon that has imported the transform once (see there).
        settings["spark.python.daemon.module"] = "jobs.transform.python_daemon"
    settings.update(delta_jvm_settings())  # Delta Lake: its jars, SQL extension and catalog
    settings.update(LARGE_VALUE_PARQUET)
    return settings


# Parquet writer settings for events of tens of MB (a 12 MB document with its pre- and
# post-image). They are Hadoop settings, read by the writer from the JVM's Hadoop
# configuration: set on a Connect session as `spark.hadoop.*`, they did not reach the writer.
# - Parquet checks a row group's and a page's buffered size only every 100 rows at first, so
#   it buffered all of a run's large rows before its first flush; 1 makes it check after the
#   first row, and its adaptive estimate spaces the checks out again for small rows;
# - row groups of 16 MB (128 by default) hold a few large rows, not dozens;
# - every row group keeps its columns' min and max values until its file closes: two whole
#   copies of a document per row group and column, for the documents' columns in `changes`
#   and every string field of `current` (whose column names Delta maps, so they cannot be
#   named here). Delta's data skipping uses its own statistics, in its log.
# With these and the run's rows held on disk (`jobs.transform.change_log`), 16 events of
# ~36 MB fold on a 2 GB driver; without the statistics setting, or with the rows held in
# memory, the driver ran out of memory (measured; a heap dump showed the copies).
LARGE_VALUE_PARQUET = {
    "spark.hadoop.parquet.page.size.row.check.min": "1",
    "spark.hadoop.parquet.block.size": str(16 << 20),
    "spark.hadoop.parquet.column.statistics.enabled": "false",
}


def local_environment(config: SparkConfig) -> dict[str, str]:
    """The environment a driver JVM started here needs: quiet logs, and Python UDF workers
    running this interpreter (its venv has pandas, bsonjs, pymongo)."""
    env = {"SPARK_CONF_DIR": _conf_dir(), "PYSPARK_PYTHON": sys.executable}
    if config.master.startswith("local"):
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def prepare_connect_mode(remote: str | None) -> None:
    """Put this process in Spark Connect mode when it will use a remote.

    PySpark builds a UDF for the mode the process is in when the UDF is made, and a classic UDF
    used over Connect fails (SESSION_OR_CONTEXT_NOT_EXISTS). The transform makes its UDFs when
    a query first uses them (`jobs.transform.udfs`), so this must run before the first query;
    `orchestration` calls it first thing, and the session sets it too.
    """
    if remote:
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"


def spark_session(config: SparkConfig | None = None) -> tuple[Any, bool]:
    """The process's SparkSession and whether this call created it: a local JVM (or a cluster
    master), or a Spark Connect session when `config.remote` is set (no JVM here then)."""
    from pyspark.sql import SparkSession  # heavy import, only where Spark is used

    config = config or SparkConfig()
    try:
        # Active for this thread or the process's default: getActiveSession() alone is
        # thread-local and would miss a session another thread started.
        return SparkSession.active(), False
    except Exception:  # PySparkRuntimeError NO_ACTIVE_OR_DEFAULT_SESSION
        pass
    settings = session_settings(config)
    if config.remote:
        check_remote_answers(config.remote)
        prepare_connect_mode(config.remote)
        builder = SparkSession.builder.remote(config.remote)
    else:
        check_java()
        for name, value in local_environment(config).items():
            os.environ.setdefault(name, value)
        settings = {**jvm_settings(config), **settings}
        builder = SparkSession.builder.appName(config.app_name).master(config.master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
        if config.remote:
            _stop_retrying_a_dead_server(session, config.remote)
            ship_code(session)
    except Exception as exc:  # py4j and Connect raise many kinds; all mean "no Spark"
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        if config.remote:
            raise SparkUnavailable(
                f"The Spark Connect session at {config.remote} did not start ({reason}).",
                f"Check {REMOTE_ENV} and the server's log (`tidemark spark status` names the "
                "local one's).",
            ) from None
        raise SparkUnavailable(
            f"Spark did not start ({reason}).",
            f"Check the Spark settings (master {config.master!r}). {JAVA_HINT}",
        ) from None
    return session, True


def check_remote_answers(remote: str, timeout: float = 5.0) -> None:
    """Fail fast when nothing listens at a Connect URL: the Connect client itself retries an
    unreachable server for minutes before it gives up."""
    parsed = urlparse(remote.split(";", 1)[0])
    if parsed.scheme != "sc" or not parsed.hostname:
        raise SparkUnavailable(
            f"The Spark Connect URL {remote!r} is not of the form sc://host:port.",
            f"Fix {REMOTE_ENV} (e.g. sc://127.0.0.1:15002).",
        )
    try:
        socket.create_connection((parsed.hostname, parsed.port or 15002), timeout).close()
    except OSError as exc:
        raise SparkUnavailable(
            f"No Spark Connect server answers at {remote} ({exc.strerror or exc}).",
            f"Start the local one with `tidemark spark start`, or point {REMOTE_ENV} at a "
            "running server.",
        ) from None


def _stop_retrying_a_dead_server(session: Any, remote: str) -> None:
    """The Connect client retries an unavailable server for about ten minutes: a server that
    died mid-run (killed, out of memory) would hang the run that long. Its retries go on only
    while something still accepts connections at the server's address."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    class WhileItListens(DefaultPolicy):
        def can_retry(self, e: BaseException) -> bool:
            if not super().can_retry(e):
                return False
            try:
                check_remote_answers(remote, timeout=2.0)
            except SparkUnavailable:
                return False
            return True

    client = session.client
    client.set_retry_policies(
        [WhileItListens() if type(p) is DefaultPolicy else p for p in client.get_retry_policies()]
    )


def stop_if_created(session: Any, created: bool) -> None:
    if created:
        _await_connect_releases(session)
        session.stop()


def _await_connect_releases(session: Any, timeout: float = 10.0) -> None:
    """A Connect client frees each query's results on the server asynchronously, and `stop()`
    releases the session first: a release still in flight then fails (SESSION_CLOSED) and
    PySpark logs a warning for each. Waiting for them first keeps run output clean."""
    if not type(session).__module__.startswith("pyspark.sql.connect"):
        return  # a classic session (its `client` property raises)
    futures = getattr(session.client, "_release_futures", None)
    if futures:
        concurrent.futures.wait(list(futures), timeout=timeout)


def discard_session(session: Any) -> None:
    """Stop a session whose server may be gone without the Connect client's minutes of
    retries, so the next `spark_session()` builds a fresh one."""
    with contextlib.suppress(Exception):
        if type(session).__module__.startswith("pyspark.sql.connect"):
            session.client.set_retry_policies([])
        session.stop()
