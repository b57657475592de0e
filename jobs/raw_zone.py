"""The raw zone: the contract between capture and transform (its schema, paths and documents).

Capture writes one row per change event in RAW_SCHEMA under `<lake>/raw/<stream>/date=/hour=`;
only files a committed batch lists are data. The envelope is typed columns, the document key
canonical Extended JSON, and `raw` the whole event's BSON, so every table can be rebuilt from
here. The documents (post- and pre-image, update description) stay inside `raw`: the transform
renders them (`document_json`) in parallel and off the capture path.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

import bsonjs
import numpy as np
import pyarrow as pa
from bson.raw_bson import RawBSONDocument

from jobs.bson_buffer import DOCUMENT, NULL, BsonBuffer
from tidemark.object_path import LakePath, list_files

# Operation types a snapshot writes into the raw zone beside the server's own: a copied document
# (`snapshot`, folded like an insert) and the barrier that opens a snapshot of a namespace
# (`snapshot_start`, which clears it like a drop: documents gone before the copy stay gone).
SyntheticOperation = Literal["snapshot", "snapshot_start"]
SNAPSHOT: Final[SyntheticOperation] = "snapshot"
SNAPSHOT_START: Final[SyntheticOperation] = "snapshot_start"

TS = pa.timestamp("us", tz="UTC")

RAW_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("operation_type", pa.string(), nullable=False),
        pa.field("db", pa.string()),
        pa.field("coll", pa.string()),
        pa.field("cluster_time", TS, nullable=False),
        pa.field("cluster_time_inc", pa.int64(), nullable=False),
        pa.field("wall_time", TS),
        pa.field("txn_number", pa.int64()),
        pa.field("lsid", pa.string()),
        pa.field("to_db", pa.string()),
        pa.field("to_coll", pa.string()),
        pa.field("collection_uuid", pa.string()),
        pa.field("document_key", pa.string()),
        pa.field("raw", pa.binary(), nullable=False),
    ]
)


RAW = "raw"


def raw_partition(lake_root: LakePath, stream: str, moment: datetime) -> LakePath:
    """`<lake>/raw/<stream>/date=YYYY-MM-DD/hour=HH`: stream names are validated slugs."""
    return lake_root / RAW / stream / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"


def stream_root(lake_root: LakePath, stream: str) -> LakePath:
    """`<lake>/raw/<stream>`: the stream's raw zone."""
    return lake_root / RAW / stream


def stream_files(lake_root: LakePath, stream: str) -> list[tuple[LakePath, float]]:
    """Every file in a stream's raw zone, temporaries included, with its modification time."""
    return list_files(stream_root(lake_root, stream))


def document_key_json(value: Any) -> str | None:
    """Canonical Extended JSON straight from the sub-document's BSON bytes (libbson, in C).

    Nested values of a RawBSONDocument stay undecoded, so no Python object is built for the
    document's fields; the output round-trips to the same bytes (int32 vs int64, -0.0, NaN,
    dates outside Python's range and all).
    """
    if value is None:
        return None
    # pymongo 4.18+ hands out sub-documents of 4 KB and more as memoryviews; bsonjs takes bytes.
    return bsonjs.dumps(bytes(value.raw), mode=bsonjs.CANONICAL)


DOCUMENT_FIELDS = {
    "full_document": "fullDocument",
    "full_document_before_change": "fullDocumentBeforeChange",
    "update_description": "updateDescription",
    "operation_description": "operationDescription",
}


def document_bson(raw: bytes) -> tuple[bytes | None, ...]:
    """The BSON of an event's documents, in DOCUMENT_FIELDS order (None where absent or null)."""
    event = RawBSONDocument(raw)
    # One pass over the top level (in C); an absent field then costs no KeyError, as .get would.
    present = set(event)
    documents = []
    for field in DOCUMENT_FIELDS.values():
        value = event[field] if field in present else None
        # pymongo 4.18+ hands out sub-documents of 4 KB and more as memoryviews: bytes for bsonjs.
        documents.append(None if value is None else bytes(value.raw))
    return tuple(documents)


def events_documents(raw: pa.Array) -> list[tuple[bytes | None, ...]]:
    """`document_bson` of each event of an Arrow binary array of `raw` values.

    The events' top levels are walked together (`BsonBuffer.locate`, a few array operations
    per field) rather than inflated one by one in pymongo, which cost about as much as
    rendering the document's plain JSON (~6 µs an event against ~2). Any event that walk does
    not read, or a document field that is neither a document nor null, sends the whole batch
    through `document_bson`.
    """
    n = len(raw)
    _, offsets_buffer, data = raw.buffers()
    width = np.dtype(np.int64 if pa.types.is_large_binary(raw.type) else np.int32)
    offsets = np.frombuffer(offsets_buffer, width, n + 1, raw.offset * width.itemsize)
    # Only the bytes of these events (a slice of a larger array shares its buffer).
    first = int(offsets[0]) if n else 0
    starts = offsets[:-1].astype(np.int64) - first
    events = data.slice(first, int(offsets[-1]) - first) if n and data is not None else None
    buffer = BsonBuffer(events.to_pybytes() if events is not None else b"")
    fields = list(DOCUMENT_FIELDS.values())
    located = buffer.locate(starts, fields) if n and raw.null_count == 0 else None
    if located is None or any(
        not np.isin(located[f].types, (0, NULL, DOCUMENT)).all() for f in fields
    ):
        return [document_bson(event) for event in raw.to_pylist()]
    whole = buffer.raw
    columns: list[list[bytes | None]] = []
    for field in fields:
        column: list[bytes | None] = [None] * n
        rows = np.flatnonzero(located[field].where(DOCUMENT))
        at = located[field].offsets[rows]
        sizes = buffer.int32s(at)
        for row, start, size in zip(rows.tolist(), at.tolist(), sizes.tolist(), strict=True):
            column[row] = whole[start : start + size]
        columns.append(column)
    return list(zip(*columns, strict=True))


def document_json(raw: bytes) -> tuple[str | None, ...]:
    """The canonical Extended JSON of an event's documents, in DOCUMENT_FIELDS order."""
    return tuple(
        None if document is None else bsonjs.dumps(document, mode=bsonjs.CANONICAL)
        for document in document_bson(raw)
    )
