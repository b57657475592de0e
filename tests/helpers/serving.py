"""Waiting for a server a test started (`dagster dev`, `tidemark ui`) to answer, for as long as
it is getting somewhere.

A fixed deadline measures the machine, not the server: on a loaded CI machine `dagster dev`
(a webserver and a code server importing Dagster, PySpark and the definitions) once took more
than the three minutes a test gave it, while it was still starting. So the wait lasts while the
server's processes use CPU or its log grows, and fails once neither happened for `quiet`
seconds (a hang), when the server exits, or after `limit` seconds in all.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def descendants(pid: int) -> set[int]:
    """Every live process under `pid`, from /proc's parent links."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by `pid` and every live process under it."""
    total = 0
    for one in {pid} | descendants(pid):
        fields = _stat_fields(one)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return total / TICKS


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def wait_until_answers(
    url: str,
    server: subprocess.Popen,
    log: Path,
    *,
    quiet: float = 120.0,
    limit: float = 900.0,
) -> None:
    """Return once `url` answers; raise AssertionError with the log's tail when `server`
    exits, when it made no progress (no CPU used, no log written) for `quiet` seconds, or
    after `limit` seconds."""
    started = last_progress = time.monotonic()
    seen = (cpu_seconds(server.pid), log.stat().st_size if log.exists() else 0)
    while not answers(url):
        now = time.monotonic()
        state = (cpu_seconds(server.pid), log.stat().st_size if log.exists() else 0)
        # A hundredth of a second of CPU over a poll: a process waiting on nothing uses less.
        if state[1] != seen[1] or state[0] - seen[0] > 0.01:
            last_progress, seen = now, state
        if server.poll() is not None:
            why = f"the server exited with {server.returncode}"
        elif now - last_progress > quiet:
            why = f"the server made no progress for {quiet:.0f} s"
        elif now - started > limit:
            why = f"the server did not answer within {limit:.0f} s"
        else:
            time.sleep(1)
            continue
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise AssertionError(f"{url}: {why}; its log ends:\n{tail}")
