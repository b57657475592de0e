"""One drain, transform, or transform then compaction in its own process, to be killed at a
random moment.

Usage: python -m tests.helpers.crash_child drain|transform|compact URI STATE_URL LAKE STREAM_JSON
"""

from __future__ import annotations

import sys
from pathlib import Path

from resources.mongo import connect
from state import StateStore
from tidemark.config import StreamConfig


def main() -> None:
    step, uri, state_url, lake, stream_json = sys.argv[1:6]
    stream = StreamConfig.model_validate_json(stream_json)
    store = StateStore(state_url)
    if step == "drain":
        from jobs.capture import drain

        drain(stream, connect(uri, raw=True), store, Path(lake), flush_rows=150)
    else:
        from jobs.transform import compact, transform
        from resources.spark import SparkConfig, spark_session

        spark, _ = spark_session(SparkConfig(master="local[1]", driver_memory="1g"))
        transform(spark, store, Path(lake), stream)
        if step == "compact":
            compact(spark, store, Path(lake), stream)


if __name__ == "__main__":
    main()
