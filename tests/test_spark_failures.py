"""Issue 23, item 15: Spark's failures are Tidemark's one-paragraph errors, and a Spark
Connect server that died is started again, with a real server on a free port and small memory.

Connect clients run in subprocesses: a Connect session switches its whole process to Connect
mode, which would turn the rest of the suite's local sessions remote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resources.processes import free_port, runs
from resources.spark_server import CONNECT_CLASS, running_server, start_server, stop_server
from tidemark.cli.commands import main

pytestmark = [pytest.mark.slow, pytest.mark.own_servers]

ROOT = Path(__file__).resolve().parent.parent

# A transform whose session opened on a live server that is then killed (SIGKILL, as the
# kernel's OOM killer or a crashed JVM would leave it) before the transform's queries run.
MID_RUN = r"""
import json, os, signal, sys, time
from pathlib import Path
os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # the mode the first query makes the UDFs in
from resources.processes import runs
from resources.spark import SparkConfig, spark_session
from resources.spark_server import CONNECT_CLASS
from jobs.transform import transform
from state import StateStore
from tidemark.config import load_config

spark, _ = spark_session(SparkConfig(remote=os.environ["URL"]))
assert spark.range(3).count() == 3  # the session works
pid = int(os.environ["PID"])
os.kill(pid, signal.SIGKILL)
while runs(pid, CONNECT_CLASS):
    time.sleep(0.1)
stream = load_config(Path(os.environ["TIDEMARK_CONFIG"])).stream("orders")
store = StateStore(os.environ["TIDEMARK_STATE_URL"])
try:
    transform(spark, store, Path(os.environ["TIDEMARK_LAKE"]), stream)
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
"""


@pytest.fixture
def setup(monkeypatch, tmp_path, mongod, db_name, client):
    config = tmp_path / "streams.yaml"
    config.write_text(
        f"streams:\n  - name: orders\n    database: {db_name}\n    collection: orders\n"
        "    max_await_time_ms: 200\n"
    )
    env = {
        "MONGODB_URI": mongod.uri,
        "TIDEMARK_CONFIG": str(config),
        "TIDEMARK_STATE_URL": f"sqlite:///{tmp_path / 'state.db'}",
        "TIDEMARK_LAKE": str(tmp_path / "lake"),
        "TIDEMARK_HOME": str(tmp_path / "home"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("TIDEMARK_SPARK_REMOTE", "TIDEMARK_SPARK_MASTER", "SPARK_CONNECT_MODE_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    try:
        yield env, home
    finally:
        stop_server(home)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    while runs(pid, CONNECT_CLASS):
        time.sleep(0.1)


def _cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_SPARK")}
    child_env.update(env, PYTHONPATH=str(ROOT))
    child_env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return subprocess.run(
        [sys.executable, "-m", "tidemark.cli.commands", *args],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_paragraph(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("tidemark:")]
    assert "Traceback" not in stderr and "JVM stacktrace" not in stderr, stderr
    assert len(lines) >= 1, stderr
    return lines[-1]


def test_a_server_killed_mid_run_is_an_error_with_its_fix_then_restarted(
    setup, client, db_name, capsys
):
    env, home = setup
    server, started = start_server(home, port=free_port(), driver_memory="512m")
    assert started
    assert main(["drain", "orders"]) == 0
    client[db_name]["orders"].insert_many([{"_id": i, "qty": i} for i in range(30)])
    assert main(["drain", "orders"]) == 0

    # 1. The server dies between the session's start and the transform's queries.
    done = subprocess.run(
        [sys.executable, "-c", MID_RUN],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "URL": server.url, "PID": str(server.pid)},
        capture_output=True,
        text=True,
        timeout=180,  # the Connect client's own retries would take about ten minutes
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["raised"] == "SparkServerLost", outcome
    message = outcome["message"]
    assert f"The Spark Connect server at {server.url} went away" in message
    assert "the transform of stream 'orders'" in message and "nothing was committed" in message
    assert "`tidemark spark start`" in message and "--driver-memory 4g" in message
    assert "\n" not in message

    # 2. The CLI pointed at the dead server: exit 2, one paragraph naming the fix.
    failed = _cli({**env, "TIDEMARK_SPARK_REMOTE": server.url}, "transform", "orders")
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "tidemark spark start" in _one_paragraph(failed.stderr)

    # 3. `tidemark spark start` brings a fresh server back over the dead one's pid file.
    assert running_server(home) is None
    capsys.readouterr()
    assert main(["spark", "start", "--driver-memory", "512m", "--timeout", "180"]) == 0
    assert "Spark Connect server started" in capsys.readouterr().out
    revived = running_server(home)
    assert revived is not None and revived.pid != server.pid
    _kill(revived.pid)

    # 4. The CLI's transform on the home's server starts it again by itself, and works.
    assert running_server(home) is None
    done = _cli(env, "transform", "orders")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "using the local Spark Connect server" in done.stderr and "(started;" in done.stderr
    row = done.stdout.splitlines()[-1].split()
    assert row[:6] == ["orders", "1", "30", "30", "1", "(merge)"], done.stdout
    assert running_server(home) is not None


# A query that runs a 512 MB driver out of memory (measured: the JVM logs
# java.lang.OutOfMemoryError: Java heap space and stops its SparkContext, and stays up).
OOM = r"""
import json, os
os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
from resources.spark import SparkConfig, spark_session
from resources.spark_failures import spark_failures
from tidemark.errors import TidemarkError

spark, _ = spark_session(SparkConfig(remote=os.environ["URL"]))
try:
    with spark_failures("the transform of stream 'big'"):
        spark.range(8).selectExpr(
            "length(concat_ws(',', collect_list(repeat(cast(id as string), 100000000)))) AS n"
        ).collect()
    print(json.dumps({"raised": None}))
except TidemarkError as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
"""


def test_a_server_out_of_memory_is_an_error_with_its_fix_and_start_replaces_it(
    tmp_path, monkeypatch, capsys
):
    home = tmp_path / "home"
    monkeypatch.setenv("TIDEMARK_HOME", str(home))
    server, _ = start_server(home, port=free_port(), driver_memory="512m")
    try:
        done = subprocess.run(
            [sys.executable, "-c", OOM],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "URL": server.url},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["raised"] in ("SparkServerLost", "SparkOutOfMemory"), outcome
        message = outcome["message"]
        assert "the transform of stream 'big'" in message and "--driver-memory 4g" in message
        assert "OutOfMemoryError" in Path(server.log).read_text(errors="replace")

        # The JVM may stay up with its SparkContext stopped: `start` replaces it all the same.
        capsys.readouterr()
        assert main(["spark", "start", "--driver-memory", "512m", "--timeout", "180"]) == 0
        assert "Spark Connect server started" in capsys.readouterr().out
        fresh = running_server(home)
        assert fresh is not None and fresh.pid != server.pid
    finally:
        stop_server(home)


# `transform --all` in a process whose session's server is killed before the first stream:
# that stream fails, the next one gets a fresh server and session.
ALL_AFTER_A_LOSS = r"""
import os, signal, sys, time
os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
from resources.processes import runs
from resources.spark import SparkConfig, spark_session
from resources.spark_server import CONNECT_CLASS
from tidemark.cli.commands import main

spark, _ = spark_session(SparkConfig(remote=os.environ["URL"]))
assert spark.range(3).count() == 3
pid = int(os.environ["PID"])
os.kill(pid, signal.SIGKILL)
while runs(pid, CONNECT_CLASS):
    time.sleep(0.1)
sys.exit(main(["transform", "--all"]))
"""


def test_transform_all_goes_on_with_a_fresh_server_after_a_lost_one(setup, client, db_name):
    env, home = setup
    Path(env["TIDEMARK_CONFIG"]).write_text(
        "streams:\n"
        + "".join(
            f"  - name: {name}\n    database: {db_name}\n    collection: {name}\n"
            "    max_await_time_ms: 200\n"
            for name in ("first", "second")
        )
    )
    assert main(["drain", "--all"]) == 0
    for name in ("first", "second"):
        client[db_name][name].insert_many([{"_id": i} for i in range(6)])
    assert main(["drain", "--all"]) == 0
    server, _ = start_server(home, port=free_port(), driver_memory="512m")
    done = subprocess.run(
        [sys.executable, "-c", ALL_AFTER_A_LOSS],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "URL": server.url, "PID": str(server.pid)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[2:]}
    assert "FAILED" in rows["first"], done.stdout
    assert rows["second"].split()[1:4] == ["1", "6", "6"], done.stdout + done.stderr[-3000:]
    assert "stream 'first' failed: The Spark Connect server" in done.stderr
    assert "Traceback" not in done.stderr
