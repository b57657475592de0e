"""A drain in its own process that stops just before its commit, for kill and lease tests.

The test side: `start_drain_child` starts one, `wait_until_ready` waits for it to reach its
commit; the child side: python -m tests.helpers.drain_child URI STATE_URL LAKE STREAM_JSON
READY_FILE. It writes its files, creates READY_FILE (the files' paths, as JSON), then waits
for READY_FILE + ".go" before committing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from jobs.capture import drain
from jobs.capture.drain_run import DrainSeams
from resources.embedded_mongo import Mongod
from resources.mongo import connect
from state import StateStore
from tidemark.config import StreamConfig

ROOT = Path(__file__).resolve().parents[2]


def start_drain_child(
    mongod: Mongod, state_url: str, lake: Path, stream: StreamConfig, ready: Path
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.drain_child",
            mongod.uri,
            state_url,
            str(lake),
            stream.model_dump_json(),
            str(ready),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_ready(path: Path, child: subprocess.Popen, timeout: float = 60) -> list[str]:
    """The paths of the files the child wrote, once it waits before its commit."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if child.poll() is not None:
            raise AssertionError(f"child exited early: {child.stderr.read()}")
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError("child never reached its commit")
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written in one call; let it land
    return json.loads(path.read_text())


def main() -> None:
    uri, state_url, lake, stream_json, ready = sys.argv[1:6]
    ready_file = Path(ready)
    go_file = Path(ready + ".go")

    def pause(files) -> None:
        ready_file.write_text(json.dumps([f.path for f in files]))
        while not go_file.exists():
            time.sleep(0.05)

    stream = StreamConfig.model_validate_json(stream_json)
    result = drain(
        stream,
        connect(uri, raw=True),
        StateStore(state_url),
        Path(lake),
        seams=DrainSeams(before_commit=pause, flush_rows=50),
    )
    print(json.dumps({"events": result.events, "batch": result.batch_id}))


if __name__ == "__main__":
    main()
