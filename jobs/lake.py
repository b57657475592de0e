"""The lake's files: whole Parquet writes, a writability probe and the sweep of orphans.

On a local disk a file is written under a hidden temporary name, flushed and renamed into
place, so a reader never sees half a file. Object storage has no rename and needs none: an
object appears whole when its upload completes, so it is written once under its final name.
Either way, being in place is not being committed: only files the state store lists in a
committed batch are data; the rest are orphans of crashed runs, swept by `gc`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.raw_zone import RAW, stream_files
from tidemark.errors import LakeError
from tidemark.object_path import LakePath, ObjectPath


def relative(lake_root: LakePath, path: LakePath) -> str:
    return path.relative_to(lake_root).as_posix()  # type: ignore[arg-type]


def ensure_writable(lake_root: LakePath) -> None:
    if isinstance(lake_root, ObjectPath):
        _probe_object_store(lake_root)
        return
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


def _probe_object_store(lake_root: ObjectPath) -> None:
    probe = lake_root / f".write-probe-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink(missing_ok=True)
    except OSError as exc:
        raise LakeError(
            f"The lake {lake_root} is not writable: {_first_line(exc)}.",
            "Check the bucket exists and that the credentials in the environment "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role) may "
            "write under that prefix, and that AWS_ENDPOINT_URL names the store for one that "
            "is not AWS. Nothing was drained or committed.",
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")


def write_parquet_atomic(table: pa.Table, final: LakePath) -> int:
    """Write `table` whole to `final` (a temporary file and a rename on disk, one upload on
    object storage); returns the file's size."""
    # Spark refuses TIMESTAMP(NANOS); microseconds are MongoDB's finest anyway (ms).
    options = {"compression": "zstd", "coerce_timestamps": "us"}
    if isinstance(final, ObjectPath):
        try:
            # The size from the upload itself: no second request to ask the store for it.
            with final.fs.open_output_stream(final.fs_path) as sink:
                pq.write_table(table, sink, **options)
                return sink.tell()
        except OSError as exc:
            raise LakeError(
                f"Writing {final} failed: {_first_line(exc)}.",
                "Check the object store is reachable and the credentials may write there; "
                "nothing was committed.",
            ) from None
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    try:
        pq.write_table(table, temp, **options)
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
    lake_root: LakePath,
    candidates: Iterable[tuple[LakePath, float]],
    keep: set[str],
    min_age_seconds: float,
    remove: Callable[[LakePath], None],
) -> SweepResult:
    """`remove` each candidate (a path and its modification time) whose lake-relative path
    `keep` lacks, unless it is younger than `min_age_seconds` (a writer with a skewed clock may
    still be at work on it)."""
    removed, young = [], []
    now = time.time()
    for path, mtime in candidates:
        rel = relative(lake_root, path)
        if rel in keep:
            continue
        if now - mtime < min_age_seconds:
            young.append(rel)
            continue
        remove(path)
        removed.append(rel)
    return SweepResult(removed, young)


def sweep_orphans(
    lake_root: LakePath, stream: str, committed: set[str], min_age_seconds: float
) -> SweepResult:
    """Delete the stream's files that no committed batch lists (older than `min_age_seconds`)."""
    result = sweep(
        lake_root,
        stream_files(lake_root, stream),
        committed,
        min_age_seconds,
        lambda path: path.unlink(missing_ok=True),
    )
    base = lake_root / RAW / stream
    if isinstance(base, Path):  # object storage has no directories to leave behind
        _remove_empty_dirs(base)
    return result


def _remove_empty_dirs(base: Path) -> None:
    if not base.exists():
        return
    for directory in sorted((p for p in base.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):  # not empty
            directory.rmdir()
