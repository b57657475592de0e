"""A drain in its own process that stops just before its commit, for kill and lease tests.

Usage: python -m tests.helpers.drain_child URI STATE_URL LAKE STREAM_JSON READY_FILE
It writes its files, creates READY_FILE, then waits for READY_FILE + ".go" before committing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from jobs.capture import drain
from resources.mongo import connect
from state import StateStore
from tidemark.config import StreamConfig


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
        before_commit=pause,
        flush_rows=50,
    )
    print(json.dumps({"events": result.events, "batch": result.batch_id}))


if __name__ == "__main__":
    main()
