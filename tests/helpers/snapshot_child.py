"""A drain that copies a snapshot in its own process and pauses after a few chunks.

Usage: python -m tests.helpers.snapshot_child URI STATE_URL LAKE STREAM_JSON READY_FILE CHUNKS
After CHUNKS committed chunks it creates READY_FILE and waits (to be killed).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from jobs.capture import drain
from jobs.capture.drain_run import DrainSeams
from resources.mongo import connect
from state import StateStore
from tidemark.config import StreamConfig


def main() -> None:
    uri, state_url, lake, stream_json, ready, chunks = sys.argv[1:7]

    def pause(snapshot) -> None:
        if snapshot.chunks >= int(chunks):
            Path(ready).write_text(str(snapshot.documents))
            while True:
                time.sleep(1)

    stream = StreamConfig.model_validate_json(stream_json)
    drain(
        stream,
        connect(uri, raw=True),
        StateStore(state_url),
        Path(lake),
        seams=DrainSeams(after_chunk=pause),
    )


if __name__ == "__main__":
    main()
