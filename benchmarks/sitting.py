"""One sitting of a transform benchmark: a mongod, a Tidemark home whose state a step can keep
and put back, and a long-lived Spark Connect server whose UI counts the jobs each step runs;
all stopped when the sitting ends. `benchmarks.transform` and `benchmarks.fold_collections`
measure in it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from resources.embedded_mongo import Mongod, start_mongod, stop_mongod
from resources.mongo import connect
from resources.spark import SparkConfig, spark_session, stop_if_created
from resources.spark_server import start_server, stop_server
from state import StateStore


class Home:
    """A Tidemark home (streams file, SQLite state, lake) a step can copy and put back."""

    def __init__(self, root: Path, streams: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "streams.yaml").write_text(streams)
        self.state = root / "state.db"
        self.lake = root / "lake"
        self.saved = root.parent / "saved"
        self.store = StateStore(f"sqlite:///{self.state}")

    def keep(self) -> None:
        shutil.rmtree(self.saved, ignore_errors=True)
        self.saved.mkdir()
        _backup(self.state, self.saved / "state.db")
        if (self.lake / "curated").exists():
            shutil.copytree(self.lake / "curated", self.saved / "curated")

    def restore(self) -> None:
        self.store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.state}{suffix}").unlink(missing_ok=True)
        _backup(self.saved / "state.db", self.state)
        self.store = StateStore(f"sqlite:///{self.state}")
        shutil.rmtree(self.lake / "curated", ignore_errors=True)
        if (self.saved / "curated").exists():
            shutil.copytree(self.saved / "curated", self.lake / "curated")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "TIDEMARK_HOME": str(self.root),
            "TIDEMARK_CONFIG": str(self.root / "streams.yaml"),
        }

    def curated_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.lake / "curated").rglob("*") if p.is_file())

    def transform(self, stream: str) -> tuple[float, str]:
        """A whole `tidemark transform` process: its seconds, start to exit, and its output."""
        started = time.perf_counter()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "tidemark"), "transform", stream],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-3000:])
        return seconds, done.stdout


def _backup(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database (its write-ahead log included)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


@dataclass
class Sitting:
    home: Home
    mongod: Mongod
    client: MongoClient  # tz-aware, for the workload's writes
    raw: MongoClient  # raw BSON, for the drains
    spark: Any  # a Connect session on the server the CLI's runs use
    ui: str
    server_seconds: float  # the server's start

    def jobs(self) -> int:
        """Jobs the Connect server's driver has run so far (its UI's REST API)."""
        try:
            with urllib.request.urlopen(f"{self.ui}/api/v1/applications", timeout=5) as r:
                app = json.load(r)[0]["id"]
            url = f"{self.ui}/api/v1/applications/{app}/jobs"
            with urllib.request.urlopen(url, timeout=5) as r:
                return len(json.load(r))
        except OSError:
            return -1


@contextmanager
def sitting(
    work: Path, streams: str, *, driver_memory: str, ui_port: int, oplog_size_mb: int = 256
) -> Iterator[Sitting]:
    mongod = start_mongod(work / "data", oplog_size_mb=oplog_size_mb)
    home = Home(work / "home", streams)
    client = MongoClient(mongod.uri, tz_aware=True)
    raw = connect(mongod.uri, raw=True)
    # Every job kept in the REST API, which counts them (Spark's UI keeps 1,000).
    ui_conf = {
        "spark.ui.enabled": "true",
        "spark.ui.port": str(ui_port),
        "spark.ui.retainedJobs": "1000000",
    }
    started = time.perf_counter()
    spark, created = None, False
    try:
        server, _ = start_server(home.root, driver_memory=driver_memory, conf=ui_conf)
        server_seconds = time.perf_counter() - started
        spark, created = spark_session(SparkConfig(remote=server.url))
        ui = f"http://127.0.0.1:{ui_port}"
        yield Sitting(home, mongod, client, raw, spark, ui, server_seconds)
    finally:
        if spark is not None:
            stop_if_created(spark, created)
        stop_server(home.root)
        raw.close()
        client.close()
        home.store.close()
        stop_mongod(mongod)
