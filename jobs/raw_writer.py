"""The raw zone's writer: chunks of raw events -> typed Arrow -> Parquet, off the capture path.

Converting an event costs more Python time than receiving it, so a drain hands chunks of raw
BSON (bytes, cheap to pass) to converter processes and keeps reading the change stream
meanwhile. A run small enough for one chunk converts it in process and starts nothing. The
files are only data once the drain commits them; a crash leaves orphans for `tidemark gc`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.bson_batch import RawDocuments, int64_values, mask
from jobs.lake import raw_partition, relative, write_parquet_atomic
from jobs.raw_events import events_table
from state.store import FileEntry

# A chunk bounds memory (raw bytes here, their Arrow form in the converter) and sizes files.
FLUSH_ROWS = 10_000
FLUSH_BYTES = 16 << 20
CONVERTERS = 1  # processes; with one core for mongod and one for Tidemark, one is enough

ChunkResult = tuple[list[tuple[str, int, int]], dict[str, int]]
# A chunk travels as its parts' buffers and positions: pickled as a few large objects.
ChunkParts = list[tuple[bytes, np.ndarray, np.ndarray]]


def convert_chunk(
    parts: ChunkParts, lake_root: str, stream: str, batch_id: str, chunk: int
) -> ChunkResult:
    """One chunk of events -> one Parquet file per hour of cluster time. Runs anywhere."""
    root = Path(lake_root)
    table = pa.concat_tables(events_table(RawDocuments(*part)) for part in parts)
    hours = int64_values(table["cluster_time"]) // 3_600_000_000
    files = []
    for part, hour in enumerate(np.unique(hours).tolist()):
        rows = table if hours[0] == hours[-1] else table.filter(mask(hours == hour))
        moment = datetime.fromtimestamp(hour * 3600, UTC)
        # Digits only after the batch id: the transform reads the batch id back from the name.
        path = raw_partition(root, stream, moment) / f"{batch_id}-{chunk:05d}{part:05d}.parquet"
        size = write_parquet_atomic(rows, path)
        files.append((relative(root, path), rows.num_rows, size))
    counts = pc.value_counts(table["operation_type"]).to_pylist()
    return files, {count["values"]: count["counts"] for count in counts}


def _exit_with_parent(parent: int) -> None:
    """Pool initializer: a converter whose drain died (killed, crashed) exits too, instead of
    lingering as an orphan holding the dead run's pipes."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="tidemark-parent-watch", daemon=True).start()


def warm_up() -> None:
    """Run in a new converter: load what conversion needs before the first chunk arrives."""
    import pyarrow.parquet  # noqa: F401

    events_table(RawDocuments.of([]))


class RawBatchWriter:
    """Collects the events a run consumes and turns them into files, chunk by chunk."""

    def __init__(
        self,
        lake_root: Path,
        stream: str,
        batch_id: str,
        flush_rows: int = FLUSH_ROWS,
        flush_bytes: int = FLUSH_BYTES,
        converters: int = CONVERTERS,
    ) -> None:
        self.lake_root = lake_root
        self.stream = stream
        self.batch_id = batch_id
        self.flush_rows = flush_rows
        self.flush_bytes = flush_bytes
        self.converters = converters
        self.files: list[FileEntry] = []
        self.counts: Counter[str] = Counter()
        self._pending: list[RawDocuments] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._chunks = 0
        self._pool: ProcessPoolExecutor | None = None
        self._running: deque[Future[ChunkResult]] = deque()

    def add(self, events: RawDocuments) -> None:
        if self._pool is None and self.converters and self._pending_rows >= self.flush_rows // 4:
            self._start_pool()  # a run this size will need it: start it while the chunk fills
        while len(events):
            # Take what fits in the chunk: up to flush_rows, and up to the event that
            # reaches flush_bytes.
            take = min(len(events), self.flush_rows - self._pending_rows)
            sizes = self._pending_bytes + np.cumsum(events.sizes[:take])
            take = min(take, int(np.searchsorted(sizes, self.flush_bytes)) + 1)
            part, events = events[:take], events[take:]
            self._pending.append(part)
            self._pending_rows += take
            self._pending_bytes += part.nbytes
            if self._pending_rows >= self.flush_rows or self._pending_bytes >= self.flush_bytes:
                self._submit(in_process=self.converters == 0)

    def close(self) -> None:
        """Write what is left and wait for every chunk; then `files` and `counts` are final."""
        try:
            if self._pending:
                # A run that fits in one chunk converts here if no converter was started.
                self._submit(in_process=self._pool is None)
            while self._running:
                self._collect(self._running.popleft().result())
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def _submit(self, in_process: bool) -> None:
        parts = [(p.buffer, p.starts, p.sizes) for p in self._pending]
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        args = (parts, str(self.lake_root), self.stream, self.batch_id, self._chunks)
        self._chunks += 1
        if in_process:
            self._collect(convert_chunk(*args))
            return
        pool = self._pool or self._start_pool()
        self._running.append(pool.submit(convert_chunk, *args))
        while len(self._running) > self.converters + 1:  # bound the chunks in flight
            self._collect(self._running.popleft().result())

    def _start_pool(self) -> ProcessPoolExecutor:
        # spawn, not fork: the parent holds MongoDB connections and threads.
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            max_workers=self.converters,
            mp_context=context,
            initializer=_exit_with_parent,
            initargs=(os.getpid(),),
        )
        for _ in range(self.converters):
            self._pool.submit(warm_up)
        return self._pool

    def _collect(self, result: ChunkResult) -> None:
        files, counts = result
        self.files.extend(FileEntry(path, rows, size) for path, rows, size in files)
        self.counts.update(counts)
