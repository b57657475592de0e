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

from bson.raw_bson import RawBSONDocument

from jobs.lake import raw_partition, relative, write_parquet_atomic
from jobs.raw_events import EventColumns
from resources.mongo import RAW_CODEC
from state.store import FileEntry

# A chunk bounds memory (raw bytes here, their Arrow form in the converter) and sizes files.
FLUSH_ROWS = 10_000
FLUSH_BYTES = 16 << 20
CONVERTERS = 1  # processes; with one core for mongod and one for Tidemark, one is enough

ChunkResult = tuple[list[tuple[str, int, int]], dict[str, int]]


def convert_chunk(
    raws: list[bytes], lake_root: str, stream: str, batch_id: str, chunk: int
) -> ChunkResult:
    """One chunk of events -> one Parquet file per hour of cluster time. Runs anywhere."""
    root = Path(lake_root)
    buffers: dict[int, EventColumns] = {}
    for raw in raws:
        event = RawBSONDocument(raw, RAW_CODEC)
        hour = event["clusterTime"].time // 3600
        buffer = buffers.get(hour)
        if buffer is None:
            buffer = buffers[hour] = EventColumns()
        buffer.add(event)
    files = []
    counts: Counter[str] = Counter()
    for part, (hour, buffer) in enumerate(sorted(buffers.items())):
        moment = datetime.fromtimestamp(hour * 3600, UTC)
        # Digits only after the batch id: the transform reads the batch id back from the name.
        path = raw_partition(root, stream, moment) / f"{batch_id}-{chunk:05d}{part:05d}.parquet"
        size = write_parquet_atomic(buffer.to_table(), path)
        files.append((relative(root, path), len(buffer), size))
        counts.update(buffer.columns["operation_type"])
    return files, dict(counts)


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

    EventColumns().to_table()


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
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._chunks = 0
        self._pool: ProcessPoolExecutor | None = None
        self._running: deque[Future[ChunkResult]] = deque()

    def add_many(self, raws: list[bytes]) -> None:
        self._pending.extend(raws)
        self._pending_bytes += sum(map(len, raws))
        if self._pool is None and self.converters and len(self._pending) >= self.flush_rows // 4:
            self._start_pool()  # a run this size will need it: start it while the chunk fills
        while len(self._pending) >= self.flush_rows or self._pending_bytes >= self.flush_bytes:
            cut = min(len(self._pending), self.flush_rows)
            if self._pending_bytes >= self.flush_bytes:
                size, cut = 0, 0
                while cut < len(self._pending) and size < self.flush_bytes:
                    size += len(self._pending[cut])
                    cut += 1
            chunk, self._pending = self._pending[:cut], self._pending[cut:]
            self._pending_bytes -= sum(map(len, chunk))
            self._submit(chunk, in_process=self.converters == 0)

    def close(self) -> None:
        """Write what is left and wait for every chunk; then `files` and `counts` are final."""
        try:
            if self._pending:
                # A run that fits in one chunk converts here if no converter was started.
                self._submit(self._pending, in_process=self._pool is None)
                self._pending, self._pending_bytes = [], 0
            while self._running:
                self._collect(self._running.popleft().result())
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def _submit(self, chunk: list[bytes], in_process: bool) -> None:
        args = (chunk, str(self.lake_root), self.stream, self.batch_id, self._chunks)
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
