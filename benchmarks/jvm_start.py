"""JVM-start benchmark: a short run's driver JVM with and without the class archive.

    .venv/bin/python -m benchmarks.jvm_start             # 3 rounds, interleaved
    .venv/bin/python -m benchmarks.jvm_start --rounds 1  # smoke

Each round starts a process that makes a Spark session with a JVM of its own (the quick
compiler alone, as the test suite's child processes and a run with `TIDEMARK_SPARK_JAVA_OPTIONS`
do), writes a 20-row Delta table and MERGEs into it, then stops. "with" maps the archive
`make install` trained (`resources/jvm_archive.py`); "without" points the JVM back at the JDK's
own base archive, the way it starts without Tidemark's. CPU is the whole machine's, from
/proc/stat, so run it on an otherwise idle machine. Prints markdown (median and range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from resources.jvm_archive import archive_path
from resources.spark import JAVA_OPTIONS_ENV, java_binary

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, tempfile, time
started = time.monotonic()
from resources.spark import SparkConfig, spark_session
spark, _ = spark_session(SparkConfig(master="local[1]", driver_memory="1g"))
session = time.monotonic() - started
table = tempfile.mkdtemp() + "/t"
spark.range(20).write.format("delta").save(table)
spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT 3 AS id) s ON t.id = s.id "
          "WHEN MATCHED THEN DELETE")
print(json.dumps({"session": session, "work": time.monotonic() - started - session}))
spark.stop()
"""


def _cpu_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system, _idle, _wait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / 100  # USER_HZ


def _round(variant: str) -> dict[str, float]:
    options = "-XX:TieredStopAtLevel=1"
    if variant == "without":
        # A later -XX:SharedArchiveFile wins: the JDK's own base archive, as with no archive.
        base = java_binary().resolve().parent.parent / "lib" / "server" / "classes.jsa"
        options += f" -XX:SharedArchiveFile={base}"
    env = {**os.environ, JAVA_OPTIONS_ENV: options}
    cpu, wall = _cpu_seconds(), time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )
    wall, cpu = time.monotonic() - wall, _cpu_seconds() - cpu
    if done.returncode != 0:
        raise SystemExit(f"the {variant} round failed: {done.stderr.strip()[-2000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall": wall, "cpu": cpu, **times}


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not archive_path().is_file():
        raise SystemExit(f"No archive at {archive_path()}: run `make install` first.")
    results: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    for _ in range(args.rounds):
        for variant in results:  # interleaved: a drift of the machine hits both alike
            results[variant].append(_round(variant))
    print(
        f"| driver JVM ({args.rounds} rounds) | process s | machine CPU s | session s | "
        "write + MERGE s |"
    )
    print("|---|---:|---:|---:|---:|")
    for variant, rounds in results.items():
        cells = [_cell([r[k] for r in rounds]) for k in ("wall", "cpu", "session", "work")]
        print(f"| {variant} the class archive | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
