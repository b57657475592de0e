"""The runs in child processes, to be SIGKILLed:
`python -m tests.helpers.torture.children child KIND ...`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime

from jobs.capture import drain
from jobs.capture.drain_run import DrainSeams
from state import StateStore
from tests.helpers.torture.config import ROOT
from tidemark.config import StreamConfig
from tidemark.settings import lake_path

# The child's Spark Connect server (the cluster variant).
REMOTE_ENV = "TIDEMARK_TORTURE_SPARK_REMOTE"


def child_main(argv: list[str]) -> None:
    """`child KIND URI STATE_URL LAKE STREAM_JSON [START END]`: one run, to be killed."""
    kind, uri, state_url, lake, stream_json = argv[:5]
    stream = StreamConfig.model_validate_json(stream_json)
    store = StateStore(state_url)
    from resources.mongo import connect

    if kind in ("transform", "compact"):
        from resources.spark import SparkConfig, prepare_connect_mode, spark_session

        # A cluster's Connect server (the cluster variant), else a JVM of the child's own.
        remote = os.environ.get(REMOTE_ENV)
        prepare_connect_mode(remote)  # the mode the first query makes the UDFs in
        from jobs.transform import compact, transform

        config = SparkConfig(master="local[1]", driver_memory="1g", remote=remote)
        spark, _ = spark_session(config)
        (transform if kind == "transform" else compact)(spark, store, lake_path(lake), stream)
        return
    client = connect(uri, raw=True)
    if kind == "replay":
        from jobs.capture import replay
        from jobs.capture import writer as raw_writer

        # Small files, so a replay has uncommitted files on disk for most of its run, as a
        # window of more than FLUSH_ROWS events has in production.
        defaults = list(raw_writer.RawBatchWriter.__init__.__defaults__ or ())
        if defaults:
            defaults[0] = 100
            raw_writer.RawBatchWriter.__init__.__defaults__ = tuple(defaults)
        start, end = (datetime.fromisoformat(v) for v in argv[5:7])
        replay(stream, client, store, lake_path(lake), start, end)
        return
    seams = DrainSeams(flush_rows=100)
    drain(stream, client, store, lake_path(lake), resnapshot=kind == "resnapshot", seams=seams)


def run_child(args: list[str], kill_after: float | None, env: dict[str, str]) -> tuple[str, str]:
    """Run a child; SIGKILL it after `kill_after` seconds if still alive. Returns (outcome, err)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.torture.children", "child", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = False
    if kill_after is not None:
        try:
            child.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            killed = True
    _, err = child.communicate(timeout=600)
    if killed:
        return "killed", ""
    if child.returncode == 0:
        return "ok", ""
    last = [line for line in err.strip().splitlines() if line.strip()]
    return "error", (last[-1] if last else f"exit {child.returncode}")[:300]


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child_main(sys.argv[2:])
