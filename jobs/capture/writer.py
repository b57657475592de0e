"""The raw zone's writer: chunks of raw events -> typed Arrow -> Parquet.

Events arrive as whole server replies (`RawDocuments`) and are converted as they arrive, a
reply at a time, by array reads (`jobs.capture._events`): a few microseconds an event, in the
drain's own process, while its reader thread has the next getMore in flight. (A converter
process was tried: pickling the chunks and starting the process cost more than converting.)
A chunk of events is then written as Parquet. The files are only data once the drain
commits them; a crash leaves orphans for `tidemark gc`.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.bson_buffer import RawDocuments, int64_values, mask
from jobs.capture._events import events_table
from jobs.lake import relative, write_parquet_atomic
from jobs.raw_zone import raw_partition
from state import FileEntry
from tidemark.object_path import LakePath

# A chunk bounds memory (its replies' buffers and their Arrow form) and sizes the files.
FLUSH_ROWS = 10_000
FLUSH_BYTES = 16 << 20

ChunkResult = tuple[list[tuple[str, int, int]], dict[str, int]]


def write_chunk(
    tables: list[pa.Table], root: LakePath, stream: str, batch_id: str, chunk: int
) -> ChunkResult:
    """One chunk of converted events -> one Parquet file per hour of cluster time."""
    table = pa.concat_tables(tables)
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


class RawBatchWriter:
    """Collects the events a run consumes and turns them into files, chunk by chunk."""

    def __init__(
        self,
        lake_root: LakePath,
        stream: str,
        batch_id: str,
        flush_rows: int = FLUSH_ROWS,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self.lake_root = lake_root
        self.stream = stream
        self.batch_id = batch_id
        self.flush_rows = flush_rows
        self.flush_bytes = flush_bytes
        self.files: list[FileEntry] = []
        self.counts: Counter[str] = Counter()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._chunks = 0

    def add(self, events: RawDocuments) -> None:
        while len(events):
            # Take what fits in the chunk: up to flush_rows, and up to the event that
            # reaches flush_bytes.
            take = min(len(events), self.flush_rows - self._pending_rows)
            sizes = self._pending_bytes + np.cumsum(events.sizes[:take])
            take = min(take, int(np.searchsorted(sizes, self.flush_bytes)) + 1)
            part, events = events[:take], events[take:]
            # Converted now, while the reader's next getMore is in flight; the reply's
            # buffer can go once nothing points into it.
            self._pending.append(events_table(part))
            self._pending_rows += take
            self._pending_bytes += part.nbytes
            if self._pending_rows >= self.flush_rows or self._pending_bytes >= self.flush_bytes:
                self._flush()

    def close(self) -> None:
        """Write what is left; then `files` and `counts` are final."""
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        files, counts = write_chunk(
            self._pending, self.lake_root, self.stream, self.batch_id, self._chunks
        )
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        self._chunks += 1
        self.files.extend(FileEntry(path, rows, size) for path, rows, size in files)
        self.counts.update(counts)
