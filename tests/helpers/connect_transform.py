"""One transform run over a Spark Connect server, in a process of its own: a Connect session
switches its whole process to Connect mode, which would turn the suite's classic session
remote. The production path (the CLI and Dagster use the local Connect server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from state import StateStore
from tidemark.config import StreamConfig
from tidemark.object_path import LakePath

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = r"""
import json, os
os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
from resources.spark import SparkConfig, spark_session
from jobs.transform import transform
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.settings import lake_path

stream = StreamConfig.model_validate_json(os.environ["STREAM"])
spark, _ = spark_session(SparkConfig(remote=os.environ["URL"]))
lake = lake_path(os.environ["LAKE"])
result = transform(spark, StateStore(os.environ["STATE_URL"]), lake, stream)
print(json.dumps({"added": result.changes_added, "rows": result.rows}))
"""


def transform_over_connect(
    url: str, store: StateStore, lake: LakePath, stream: StreamConfig
) -> dict[str, Any]:
    """Run the transform of `stream` on the server at `url`: {"added": events, "rows": rows}."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "STREAM": stream.model_dump_json(),
            "URL": url,
            "STATE_URL": store.url,
            "LAKE": str(lake),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
