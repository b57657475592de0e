"""The lake on disk: atomic Parquet writes, a writability probe and the sweep of orphans.

A file is written under a hidden temporary name, flushed to disk and renamed into place, so a
reader never sees half a file. Being in place is not being committed: only files the state
store lists in a committed batch are data; the rest are orphans of crashed runs, swept by `gc`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.raw_zone import RAW, stream_files
from tidemark.errors import LakeError


def relative(lake_root: Path, path: Path) -> str:
    return path.relative_to(lake_root).as_posix()


def ensure_writable(lake_root: Path) -> None:
    try:
        lake_root.mkdir(parents=True, exist_ok=True)
        # A name of its own per call: runs in threads of one process probe at the same time.
        handle, probe = tempfile.mkstemp(prefix=".write-probe-", dir=lake_root)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise LakeError(
            f"The lake directory {lake_root} is not writable: {exc.strerror or exc}.",
            "Set TIDEMARK_LAKE to a directory this user may write, or fix its permissions. "
            "Nothing was drained or committed.",
        ) from None


def write_parquet_atomic(table: pa.Table, final: Path) -> int:
    """Write `table` to `final` via a temporary file and a rename; returns the file's size."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    try:
        # Spark refuses TIMESTAMP(NANOS); microseconds are MongoDB's finest anyway (ms).
        pq.write_table(table, temp, compression="zstd", coerce_timestamps="us")
        with open(temp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, final)
        _fsync_dir(final.parent)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise LakeError(
            f"Writing {final} failed: {exc.strerror or exc}.",
            "Check free space and permissions of the lake (TIDEMARK_LAKE); nothing was committed.",
        ) from None
    return final.stat().st_size


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SweepResult:
    removed: list[str]
    kept_young: list[str]


def sweep(
    lake_root: Path,
    candidates: Iterable[Path],
    keep: set[str],
    min_age_seconds: float,
    remove: Callable[[Path], None],
) -> SweepResult:
    """`remove` each candidate whose lake-relative path `keep` lacks, unless it is younger
    than `min_age_seconds` (a writer with a skewed clock may still be at work on it)."""
    removed, young = [], []
    now = time.time()
    for path in candidates:
        rel = relative(lake_root, path)
        if rel in keep:
            continue
        if now - path.stat().st_mtime < min_age_seconds:
            young.append(rel)
            continue
        remove(path)
        removed.append(rel)
    return SweepResult(removed, young)


def sweep_orphans(
    lake_root: Path, stream: str, committed: set[str], min_age_seconds: float
) -> SweepResult:
    """Delete the stream's files that no committed batch lists (older than `min_age_seconds`)."""
    result = sweep(
        lake_root,
        stream_files(lake_root, stream),
        committed,
        min_age_seconds,
        lambda path: path.unlink(missing_ok=True),
    )
    _remove_empty_dirs(lake_root / RAW / stream)
    return result


def _remove_empty_dirs(base: Path) -> None:
    if not base.exists():
        return
    for directory in sorted((p for p in base.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):  # not empty
            directory.rmdir()
