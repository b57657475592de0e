"""One drain, transform, or transform then compaction in its own process, to be killed at a
random moment; or a transform that SIGKILLs itself at an exact point of its Delta commits.

Usage: python -m tests.helpers.crash_child drain|transform|compact URI STATE_URL LAKE STREAM_JSON
       python -m tests.helpers.crash_child kill:POINT URI STATE_URL LAKE STREAM_JSON

A random-kill child (drain, transform, compact) prints, on its stdout, `begun` when its run
starts (after its imports and its JVM's start), `committed` after each Delta commit and
`compacting` when its compaction starts: the harness (tests/test_crash_harness.py) draws its
kill moments from `begun` on and files each kill under the last line it saw.

POINT (the kill tests, tests/test_delta_kills.py):
- `during:N`: inside the Nth commit to a `current` table of the run (a MERGE into a table that
  exists), once the commit has begun writing its data files and before Delta logs it;
- `after:N`: right after the Nth commit to a `current` table, before the next table's;
- `before_commit`: after the run's last Delta commit, before the state store's commit.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from jobs.capture.drain_run import DrainSeams
from resources.mongo import connect
from state import StateStore
from tidemark.config import StreamConfig


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def data_files(table: Path) -> set[Path]:
    """The table's files outside its log (data files, deletion vectors)."""
    return {p for p in table.rglob("*") if p.is_file() and "_delta_log" not in p.parts}


def kill_when_writing(table: Path) -> None:
    """SIGKILL this process as soon as a new file appears in `table` (Delta writes a commit's
    files in place, then logs them: a new file means the commit is under way, not made)."""
    before = data_files(table)

    def watch() -> None:
        while True:
            if data_files(table) - before:
                die()
            time.sleep(0.001)

    threading.Thread(target=watch, daemon=True).start()


def install_kill(point: str) -> None:
    """Arm the kill named by `point` (see the module docstring)."""
    from jobs.transform import delta_io

    if point == "before_commit":
        return  # the transform's own `before_commit` hook
    when, _, nth = point.partition(":")
    seen = 0

    def hook(stage: str, path: Path, slot: int) -> None:
        nonlocal seen
        if path.name != "current":
            return
        if stage == "before":
            seen += 1
            if when == "during" and seen == int(nth):
                kill_when_writing(path)
        elif when == "after" and seen == int(nth):
            die()

    delta_io.COMMIT_HOOK = hook


def report(line: str) -> None:
    """Tell the harness where the run is (see the module docstring)."""
    print(line, flush=True)


def report_commits() -> None:
    from jobs.transform import delta_io

    def hook(stage: str, path: Path, slot: int) -> None:
        if stage == "after":
            report("committed")

    delta_io.COMMIT_HOOK = hook


def main() -> None:
    step, uri, state_url, lake, stream_json = sys.argv[1:6]
    stream = StreamConfig.model_validate_json(stream_json)
    store = StateStore(state_url)
    if step == "drain":
        from jobs.capture import drain

        client = connect(uri, raw=True)
        report("begun")
        drain(stream, client, store, Path(lake), seams=DrainSeams(flush_rows=150))
    else:
        from jobs.transform import compact, transform
        from resources.spark import SparkConfig, spark_session

        spark, _ = spark_session(SparkConfig(master="local[1]", driver_memory="1g"))
        before_commit = None
        if step.startswith("kill:"):
            point = step.removeprefix("kill:")
            install_kill(point)
            before_commit = die if point == "before_commit" else None
        else:
            report_commits()
            report("begun")
        transform(spark, store, Path(lake), stream, before_commit=before_commit)
        if step.startswith("kill:"):
            sys.exit(f"the transform finished: the kill point {step!r} was never reached")
        if step == "compact":
            report("compacting")
            compact(spark, store, Path(lake), stream)


if __name__ == "__main__":
    main()
