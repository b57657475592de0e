"""The benchmark scripts at tiny sizes, so they keep working (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_drain_benchmark_smoke():
    out = _run(
        "benchmarks.drain",
        "--inserts",
        "1500",
        "--updates",
        "500",
        "--replaces",
        "100",
        "--deletes",
        "200",
        "--repeats",
        "1",
        "--memory",
        "1000,2000",
    )
    assert "| consumer | events | events/s |" in out
    for label in ("server ceiling", "**Tidemark drain**", "doing nothing", "json.dumps"):
        assert label in out
    assert out.count("| 2,300 |") == 7  # every consumer read the whole range
    assert "lake on S3" in out and "Lake on S3 / lake on local disk" in out
    assert "| 1,000 |" in out and "| 2,000 |" in out  # the memory table
    assert "a drain that finds nothing" in out
    assert "nothing written since the last run" in out and "other collections written to" in out


@pytest.mark.slow
def test_transform_benchmark_smoke():
    out = _run(
        "benchmarks.transform",
        "--documents",
        "2000",
        "--changes",
        "300",
        "--inserts",
        "100",
        "--warm",
        "1",
    )
    assert "warm s (median of 1)" in out
    assert "| first load of 2,000 documents | 2,000 | 2,000 |" in out
    assert "| 300 updates into 2,000 | 300 | 2,000 |" in out
    assert "| 100 inserts into 2,000 | 100 | 2,100 |" in out
    assert "| a quiet run (nothing new) | 0 |" in out
    assert "| anchor: full recompute of current from changes |" in out
    assert "x the typed columns alone" in out


@pytest.mark.slow
def test_fold_collections_benchmark_smoke():
    out = _run(
        "benchmarks.fold_collections",
        *("--collections", "2", "--documents", "50", "--changes", "10", "--rounds", "1"),
    )
    for stream in ("vectors_always", "vectors_when_large"):
        assert f"| first load | {stream} |" in out and f"| 10 updates | {stream} |" in out
    assert "| anchor: full recompute |" in out


@pytest.mark.slow
def test_catalog_scale_benchmark_smoke():
    out = _run(
        "benchmarks.catalog_scale", "--collections", "0", "6", "--streams", "2", "--repeats", "1"
    )
    assert "| collections | assets | cold process |" in out
    # 3 stream assets per stream, and a changes and a current asset per collection.
    assert "| 0 | 6 |" in out and "| 6 | 18 |" in out
    assert "| collections | asset nodes | webserver start to location loaded |" in out
    assert out.rstrip().endswith("| 3 of 3 |")  # s1's three collections drawn in its graph


@pytest.mark.slow
def test_jvm_start_benchmark_smoke():
    out = _run("benchmarks.jvm_start", "--rounds", "1")
    assert "| with the class archive |" in out and "| without the class archive |" in out
