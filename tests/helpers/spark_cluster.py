"""A real Spark standalone cluster on loopback for the cluster tests: a master and two workers
started from the pyspark wheel's own jars (`bin/spark-class ...Master` / `...Worker`), each a
JVM of its own, and a Spark Connect server attached to the master as the driver
(`tidemark spark start --master spark://... --executor-python ...`).

The executors share nothing with the test's process but the machine: the lake is on the S3
server, and their Python is `worker_python`, the venv's interpreter without its site
initialisation, so the venv's libraries import but Tidemark (an editable install, found
through a .pth file) does not: Tidemark must ship its own modules to the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from resources.processes import free_port
from resources.spark import (
    JAVA_OPTIONS_ENV,
    SparkConfig,
    check_java,
    local_environment,
    quiet_conf_dir,
)
from resources.spark_server import ConnectServer, running_server, spark_home, stop_server

START_TIMEOUT_S = 120
WORKERS = 2
WORKER_MEMORY = "1g"


@dataclass
class SparkCluster:
    directory: Path
    master_url: str
    master_ui: int
    processes: list[subprocess.Popen] = field(default_factory=list)
    server: ConnectServer | None = None

    @property
    def work_dirs(self) -> list[Path]:
        return [self.directory / f"worker-{n}" for n in range(WORKERS)]


def worker_python(directory: Path) -> Path:
    """An interpreter for the executors: the venv's Python with `-S` (no site: no .pth file,
    so no editable Tidemark) and the venv's site-packages on its path, after whatever Spark
    puts there (the session's artifacts)."""
    site = sysconfig.get_paths()["purelib"]
    script = directory / "worker-python"
    script.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}"\n'
        f'exec "{sys.executable}" -S "$@"\n'
    )
    script.chmod(0o755)
    return script


def _spawn(cluster: SparkCluster, name: str, argv: list[str], env: dict[str, str]) -> None:
    log = open(cluster.directory / f"{name}.log", "wb")  # noqa: SIM115 (until the JVM exits)
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    cluster.processes.append(process)


def _alive_workers(cluster: SparkCluster) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.master_ui}/json/", timeout=2) as r:
            state = json.load(r)
    except (OSError, ValueError):
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def start_cluster(directory: Path, home: Path) -> SparkCluster:
    """The master, its workers (registered), then the Connect server attached to it."""
    check_java()
    directory.mkdir(parents=True, exist_ok=True)
    port, ui = free_port("127.0.0.1"), free_port("127.0.0.1")
    cluster = SparkCluster(directory, f"spark://127.0.0.1:{port}", ui)
    spark_class = str(spark_home() / "bin" / "spark-class")
    env = {
        **os.environ,
        **local_environment(SparkConfig(master="local")),  # loopback, the workers' Python
        # Quiet logs for the daemons and the executors they start (not drivers: their class
        # archive needs an empty conf dir, and they take the log config by path).
        "SPARK_CONF_DIR": quiet_conf_dir(),
        "SPARK_HOME": str(spark_home()),
    }
    env.pop("PYTHONPATH", None)
    try:
        _spawn(cluster, "master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(ui),
        ], env)  # fmt: skip
        for n, work in enumerate(cluster.work_dirs):
            work.mkdir()
            _spawn(cluster, f"worker-{n}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                "--host", "127.0.0.1", "--port", str(free_port("127.0.0.1")),
                "--webui-port", str(free_port("127.0.0.1")), "--cores", "1",
                "--memory", WORKER_MEMORY, "--work-dir", str(work),
            ], env)  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while _alive_workers(cluster) < WORKERS:
            if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.processes):
                logs = "\n".join(
                    f"{log.name}: {log.read_text(errors='replace')[-800:]}"
                    for log in sorted(directory.glob("*.log"))
                )
                raise RuntimeError(f"the standalone cluster did not come up:\n{logs}")
            time.sleep(0.5)
        # As a team would attach it: the CLI, its driver on the address the master is at.
        started = subprocess.run(
            [
                str(Path(sys.executable).parent / "tidemark"), "spark", "start",
                "--master", cluster.master_url, "--executor-python",
                str(worker_python(directory)), "--driver-memory", "1g",
                "--port", str(free_port("127.0.0.1")),
            ],
            # A long-lived server keeps the JVM's defaults (README), not the quick compiler
            # the suite gives its short-lived JVMs: it serves the module's runs for minutes.
            env={**os.environ, "TIDEMARK_HOME": str(home), JAVA_OPTIONS_ENV: ""},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if started.returncode != 0:
            raise RuntimeError(f"tidemark spark start --master failed: {started.stderr[-2000:]}")
        cluster.server = running_server(home)
    except BaseException:
        stop_cluster(cluster, home)
        raise
    return cluster


def stop_cluster(cluster: SparkCluster, home: Path) -> None:
    stop_server(home)
    for process in reversed(cluster.processes):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    for process in cluster.processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
