"""The long-lived local Spark Connect server behind `tidemark spark start|stop|status`.

A run that builds its own SparkSession starts a JVM (7-25 s); a Connect client reaches a
running server in about a second. The server is the pyspark wheel's own
(`jars/spark-connect_*.jar`, run by `sbin/spark-daemon.sh`), bound to 127.0.0.1, with the
settings of `spark_session()` (Delta Lake's jars, SQL extension and catalog among them) and
Python UDF workers running this venv's interpreter. Its state, pid file and logs live under
`<home>/spark`, never in the venv. Like the embedded mongod, a running one is reused;
`stop_server` shuts it down. Plain functions, no Dagster.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from resources.daemon_record import exclusive_lock, load_record, save_record
from resources.delta import DELTA_VERSION
from resources.processes import free_port, listens_on, port_free, runs, terminate
from resources.spark import (
    REMOTE_ENV,
    SparkConfig,
    check_java,
    jvm_settings,
    local_environment,
    session_settings,
)
from tidemark.errors import SparkServerError

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
HOST = "127.0.0.1"
_IDENT = "tidemark"  # SPARK_IDENT_STRING: fixed pid and log file names
# The checkout this module belongs to: the server's Python workers import Tidemark's UDF
# modules from it, so they run the same code as the client that started the server.
_PROJECT_ROOT = Path(__file__).resolve().parent.parent
_REINSTALL = "Run `make install` (pyspark 4 from PyPI ships the Connect server)."


@dataclass(frozen=True)
class ConnectServer:
    """A Connect server this module started, as recorded under the Tidemark home."""

    port: int
    pid: int
    log: str
    driver_memory: str
    python: str
    pyspark: str
    project: str  # the checkout whose code the server's Python workers import
    # Delta Lake's version on its classpath; "" for a server started before Delta was loaded
    delta: str = ""

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"


def server_dir(home: Path) -> Path:
    return home / "spark"


def _state_file(home: Path) -> Path:
    return server_dir(home) / "connect.json"


def _pid_file(home: Path) -> Path:
    # The name spark-daemon.sh gives it: spark-<ident>-<class>-<instance>.pid
    return server_dir(home) / "run" / f"spark-{_IDENT}-{CONNECT_CLASS}-1.pid"


def spark_home() -> Path:
    """The installed pyspark package, which is a Spark distribution with the Connect jar."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "sbin" / "spark-daemon.sh").exists():
        raise SparkServerError(
            f"The pyspark package at {home} has no sbin/spark-daemon.sh.", _REINSTALL
        )
    if not any((home / "jars").glob("spark-connect_*.jar")):
        raise SparkServerError(
            f"The pyspark package at {home} has no jars/spark-connect_*.jar.", _REINSTALL
        )
    return home


def running_server(home: Path) -> ConnectServer | None:
    """The home's server if its process lives and its port accepts connections."""
    saved = _load(home)
    if saved and runs(saved.pid, CONNECT_CLASS) and listens_on(saved.pid, saved.port):
        return saved
    return None


def last_log(home: Path) -> Path | None:
    """The log of the home's most recent server, running or not."""
    saved = _load(home)
    if saved:
        return Path(saved.log)
    logs = sorted((server_dir(home) / "logs").glob("*.out"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def start_server(
    home: Path,
    *,
    port: int | None = None,
    driver_memory: str = "2g",
    master: str = "local[*]",
    timeout: float = 120.0,
    conf: dict[str, str] | None = None,
) -> tuple[ConnectServer, bool]:
    """The home's server, started when none runs, once it answers a query; True when this
    call started it. Without `port`, the last one used, else 15002, else a free one."""
    with _start_lock(home):
        running = running_server(home)
        if running and _answers_query(running.url):
            _check_same_code(running)
            return running, False
        if running:
            # Alive and listening but answering nothing: a driver that ran out of memory
            # stops its SparkContext and stays up. A fresh one replaces it.
            terminate(running.pid, CONNECT_CLASS)
        saved = _load(home)
        if saved and runs(saved.pid, CONNECT_CLASS):
            server, started = saved, False  # launched by a `start` that was interrupted
        else:
            check_java()
            server = _launch(home, port or _default_port(saved), driver_memory, master, conf)
            started = True
        try:
            _wait_ready(server, timeout)
        except SparkServerError:
            # A server that did not come up must not linger.
            terminate(server.pid, CONNECT_CLASS)
            _state_file(home).unlink(missing_ok=True)
            raise
        _check_same_code(server)
        return server, started


def stop_server(home: Path, timeout: float = 30.0) -> bool:
    """Stop the home's server if it runs; True when one was stopped."""
    if not server_dir(home).is_dir():
        # Never started from this home: a stop makes no home (a home holding only a lock
        # would be named beside the one in use in every command's notice).
        return False
    with _start_lock(home):
        saved = _load(home)
        pid = saved.pid if saved else _read_pid(home)
        running = pid is not None and runs(pid, CONNECT_CLASS)
        if running:
            assert pid is not None
            terminate(pid, CONNECT_CLASS, timeout)
        _state_file(home).unlink(missing_ok=True)
        _pid_file(home).unlink(missing_ok=True)
        return running


def _default_port(saved: ConnectServer | None) -> int:
    for candidate in (saved.port if saved else None, DEFAULT_PORT):
        if candidate and port_free(HOST, candidate):
            return candidate
    # Someone else's server holds 15002 (a shared machine): any free port will do, the
    # state file and `tidemark spark status` say which.
    return free_port(HOST)


def _launch(
    home: Path, port: int, driver_memory: str, master: str, conf: dict[str, str] | None = None
) -> ConnectServer:
    import pyspark

    spark = spark_home()
    config = SparkConfig(master=master, driver_memory=driver_memory, conf=conf or {})
    directory = server_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    orphan = _read_pid(home)
    if orphan and runs(orphan, CONNECT_CLASS):
        terminate(orphan, CONNECT_CLASS)  # this home's server, its record lost: not a second one
    _pid_file(home).unlink(missing_ok=True)  # spark-daemon.sh refuses to start over a live one
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ONLY_ENV}
    own_conf = env.get("SPARK_CONF_DIR")  # a user's wins, as for a local session
    # The server outlives this shell: its UDF workers must be this venv's Python, whatever
    # PYSPARK_PYTHON the shell had.
    env.update(local_environment(config))
    # A cluster's executors run their own Python (`spark.pyspark.python`); Connect reads the
    # UDFs' interpreter from the server's PYSPARK_PYTHON first, so it must say the same.
    if "spark.pyspark.python" in config.conf:
        env["PYSPARK_PYTHON"] = config.conf["spark.pyspark.python"]
    env.update(
        SPARK_HOME=str(spark),
        SPARK_LOG_DIR=str(directory / "logs"),
        SPARK_PID_DIR=str(_pid_file(home).parent),
        SPARK_IDENT_STRING=_IDENT,
        PYTHONPATH=os.pathsep.join(filter(None, [str(_PROJECT_ROOT), env.get("PYTHONPATH")])),
    )
    if own_conf:
        env["SPARK_CONF_DIR"] = own_conf
    settings = {
        **jvm_settings(config),
        **session_settings(config),  # the defaults of every Connect session on it
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
    }
    # What sbin/start-connect-server.sh runs; the pyspark 4.2 wheel ships spark-daemon.sh
    # but not that script (4.3's has both).
    args = [str(spark / "sbin" / "spark-daemon.sh"), "submit", CONNECT_CLASS, "1"]
    args += ["--name", "Spark Connect server", "--master", master]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    try:
        # cwd: a Spark JVM writes derby.log and spark-warehouse/ where it starts.
        done = subprocess.run(
            args, env=env, cwd=directory, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkServerError(f"spark-daemon.sh did not run: {exc}.", _REINSTALL) from None
    output = (done.stdout or "") + (done.stderr or "")
    logged = re.search(r"logging to (\S+)", output)
    pid = _read_pid(home)
    if done.returncode != 0 or logged is None or pid is None:
        raise SparkServerError(
            f"The Spark Connect server did not start (exit {done.returncode}): "
            f"{' | '.join(output.strip().splitlines()[-3:])}.",
            f"Look at the logs in {directory / 'logs'}.",
        )
    server = ConnectServer(
        port=port,
        pid=pid,
        log=logged.group(1),
        driver_memory=driver_memory,
        python=sys.executable,
        pyspark=pyspark.__version__,
        project=str(_PROJECT_ROOT),
        delta=DELTA_VERSION,
    )
    save_record(_state_file(home), server)
    return server


# A parent shell's Connect settings mean nothing to the server (its own PySpark would read
# them), so they stay out of its environment.
_CLIENT_ONLY_ENV = frozenset(
    {"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", REMOTE_ENV}
)


def _wait_ready(server: ConnectServer, timeout: float) -> None:
    """Until the server answers a query from a Connect client, or it died, or time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not runs(server.pid, CONNECT_CLASS):
            raise SparkServerError(
                f"The Spark Connect server exited while starting: {_log_reason(server)}. "
                f"Its log is {server.log}.",
                _fix_for(server),
            )
        # Its own listening socket, not whatever else may hold the port, is asked.
        if listens_on(server.pid, server.port) and _answers_query(server.url):
            return
        time.sleep(0.25)
    raise SparkServerError(
        f"The Spark Connect server did not answer at {server.url} within {timeout:.0f} s "
        f"(it was stopped). Its log is {server.log}.",
        "Look at the log; a slow machine may need a longer wait (tidemark spark start "
        "--timeout SECONDS).",
    )


def _answers_query(url: str) -> bool:
    # A Connect session object of its own: the builder would also switch this whole process
    # to Connect mode (SPARK_CONNECT_MODE_ENABLED), which a caller may not want.
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession(connection=url)
    session.client.set_retry_policies([])  # one try: the caller's loop does the waiting
    try:
        return session.range(1).count() == 1
    except Exception:  # gRPC UNAVAILABLE and friends while the server finishes starting
        return False
    finally:
        with contextlib.suppress(Exception):
            session.stop()


def _log_reason(server: ConnectServer) -> str:
    """The log's most telling line: its first Java exception, else its first error, else its
    last line."""
    try:
        lines = Path(server.log).read_text(errors="replace").splitlines()
    except OSError:
        return "no log was written"
    exceptions = [ln for ln in lines if re.match(r"\s*(Caused by: )?[\w.$]+(Exception|Error):", ln)]
    errors = [ln for ln in lines if " ERROR " in ln]
    line = next(iter(exceptions or errors), lines[-1] if lines else "the log is empty")
    return line.strip()[:300]


def _fix_for(server: ConnectServer) -> str:
    text = ""
    with contextlib.suppress(OSError):
        text = Path(server.log).read_text(errors="replace")
    if "Address already in use" in text or "Failed to bind" in text:
        return (
            f"Port {server.port} on {HOST} is taken by another process: pass a free one "
            "(tidemark spark start --port N), or stop what listens there."
        )
    return "Read the log; fix what it names and run `tidemark spark start` again."


def _check_same_code(server: ConnectServer) -> None:
    """A client must match the server's Spark and Delta versions, and the server's Python
    workers must run the client's venv and checkout (they import Tidemark's UDF modules)."""
    import pyspark

    theirs = (Path(server.python).parent, server.pyspark, server.project, server.delta)
    ours = (Path(sys.executable).parent, pyspark.__version__, str(_PROJECT_ROOT), DELTA_VERSION)
    if theirs != ours:
        raise SparkServerError(
            f"The Spark Connect server at {server.url} was started from {server.project} with "
            f"{server.python} (pyspark {server.pyspark}, Delta Lake {server.delta or 'none'}); "
            f"this is {_PROJECT_ROOT} with {sys.executable} (pyspark {pyspark.__version__}, "
            f"Delta Lake {DELTA_VERSION}), and its Python workers would run the other code.",
            "Stop it with `tidemark spark stop` and start it again, or give this checkout a "
            "TIDEMARK_HOME of its own.",
        )


def _load(home: Path) -> ConnectServer | None:
    return load_record(_state_file(home), ConnectServer)


def _read_pid(home: Path) -> int | None:
    try:
        return int(_pid_file(home).read_text().strip())
    except (OSError, ValueError):
        return None


def _start_lock(home: Path) -> contextlib.AbstractContextManager[None]:
    """Two `start`s at once (make ui in one shell, make demo in another) start one server."""
    return exclusive_lock(server_dir(home) / "start.lock")
