"""Change events (raw BSON) to Arrow in the raw zone's schema: the two readers that fill it.

The envelope becomes typed columns, the document key canonical Extended JSON, and the whole
event is kept as its BSON bytes, so every table can be rebuilt from the raw zone. The
documents themselves (post- and pre-image, update description) stay inside `raw` here: their
canonical JSON costs more per event than the server takes to produce the event, so it is made
by the transform, in parallel and off the capture path (`document_json`).

`array_events_table` reads a whole reply with array operations (`jobs.bson_buffer`), ~3 us an
event; `per_event_table` decodes each event with pymongo, ~20 us. They give the same table
(tests/test_event_conversion.py); the second takes the replies the first does not read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import bsonjs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bson.raw_bson import RawBSONDocument

from jobs.bson_buffer import (
    BINARY,
    DATETIME,
    DOCUMENT,
    INT32,
    INT64,
    NULL,
    OBJECT_ID,
    STRING,
    TIMESTAMP,
    BsonBuffer,
    Located,
    RawDocuments,
    absent,
    bitmap,
    int32_at,
    numbers,
    text_scalar,
    texts,
)
from jobs.raw_zone import RAW_SCHEMA, TS, document_key_json
from resources.mongo import RAW_CODEC


def event_id(raw: bytes) -> str | None:
    """The token's `_data` read straight from the event's first bytes.

    The server writes `_id: {_data: "<hex>"}` first in every change event; checking each byte
    of that layout makes this exact, and anything else returns None (decode instead).
    """
    if raw[4:9] == b"\x03_id\x00" and raw[13:20] == b"\x02_data\x00":
        length = int32_at(raw, 20)[0]
        if raw[23 + length : 24 + length] == b"\x00":
            return raw[24 : 23 + length].decode()
    return None


class EventColumns:
    """Column buffers for one partition's events; `to_table()` makes the Arrow table."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {f.name: [] for f in RAW_SCHEMA}
        self.nbytes = 0
        self._namespaces: dict[bytes, tuple[Any, Any]] = {}  # ns sub-document -> (db, coll)

    def __len__(self) -> int:
        return len(self.columns["event_id"])

    def _namespace(self, ns: RawBSONDocument | None) -> tuple[Any, Any]:
        if ns is None:
            return None, None
        found = self._namespaces.get(ns.raw)
        if found is None:
            found = self._namespaces[ns.raw] = (ns.get("db"), ns.get("coll"))
        return found

    def add(self, event: RawBSONDocument) -> None:
        raw = event.raw
        # One dict of the top level (sub-documents stay raw): plain lookups from here on.
        doc = dict(event.items())
        c = self.columns
        c["event_id"].append(event_id(raw) or doc["_id"]["_data"])
        c["operation_type"].append(doc["operationType"])
        db, coll = self._namespace(doc.get("ns"))
        c["db"].append(db)
        c["coll"].append(coll)
        ts = doc["clusterTime"]
        c["cluster_time"].append(ts.time)  # seconds; made a timestamp column in to_table()
        c["cluster_time_inc"].append(ts.inc)
        wall = doc.get("wallTime")
        c["wall_time"].append(wall if isinstance(wall, datetime) else None)
        c["txn_number"].append(doc.get("txnNumber"))
        lsid = doc.get("lsid")
        c["lsid"].append(document_key_json(lsid) if lsid is not None else None)
        to = doc.get("to")
        c["to_db"].append(to.get("db") if to is not None else None)
        c["to_coll"].append(to.get("coll") if to is not None else None)
        uuid = doc.get("collectionUUID")
        c["collection_uuid"].append(bytes(uuid).hex() if uuid is not None else None)
        c["document_key"].append(document_key_json(doc.get("documentKey")))
        c["raw"].append(raw)
        self.nbytes += len(raw)

    def to_table(self) -> pa.Table:
        seconds = pa.array(self.columns["cluster_time"], pa.int64())
        columns = dict(self.columns)
        columns["cluster_time"] = pc.multiply(seconds, 1_000_000).cast(TS)
        return pa.Table.from_pydict(columns, schema=RAW_SCHEMA)


def events_table(docs: RawDocuments) -> pa.Table:
    """Change events -> the raw zone's table. Whole buffers are read with array operations
    (`jobs.bson_buffer`); a reply holding anything that path does not read takes the
    per-event path (`EventColumns`), which gives the same table for every event both read."""
    table = array_events_table(docs)
    return per_event_table(docs) if table is None else table


def per_event_table(docs: RawDocuments) -> pa.Table:
    columns = EventColumns()
    for raw in docs.raws():
        columns.add(RawBSONDocument(raw, RAW_CODEC))
    return columns.to_table()


_ENVELOPE = [
    "_id",
    "operationType",
    "clusterTime",
    "wallTime",
    "ns",
    "documentKey",
    "txnNumber",
    "lsid",
    "to",
    "collectionUUID",
]
_ABSENT = (0, NULL)


def array_events_table(docs: RawDocuments) -> pa.Table | None:
    """The table by array reads; None when an event holds what they do not read."""
    if len(docs.buffer) >= 2**31 - 64:  # Arrow's view offsets are int32
        return None
    b = docs.bson()
    top = b.locate(docs.starts, _ENVELOPE)
    if top is None:
        return None

    def typed(name: str, *allowed: int) -> bool:
        return bool(np.isin(top[name].types, allowed).all())

    if not (
        typed("_id", DOCUMENT)
        and typed("operationType", STRING)
        and typed("clusterTime", TIMESTAMP)
        and typed("ns", DOCUMENT, *_ABSENT)
        and typed("to", DOCUMENT, *_ABSENT)
        and typed("documentKey", DOCUMENT, *_ABSENT)
        and typed("lsid", DOCUMENT, *_ABSENT)
        and typed("txnNumber", INT32, INT64, *_ABSENT)
        and typed("collectionUUID", BINARY, *_ABSENT)
    ):
        return None
    token = _inner(b, top["_id"], ["_data"])
    ns = _inner(b, top["ns"], ["db", "coll"])
    to = _inner(b, top["to"], ["db", "coll"])
    if token is None or ns is None or to is None or not token["_data"].where(STRING).all():
        return None
    names = [ns["db"], ns["coll"], to["db"], to["coll"]]
    if not all(np.isin(name.types, (STRING, *_ABSENT)).all() for name in names):
        return None
    document_keys = _document_keys(b, top["documentKey"])
    if document_keys is None:
        return None
    clock = b.uint64s(top["clusterTime"].offsets)  # a BSON Timestamp: time << 32 | increment
    wall = top["wallTime"]
    txn = top["txnNumber"]
    txn_values = np.where(txn.where(INT32), b.int32s(txn.offsets), b.int64s(txn.offsets))
    columns = [
        b.strings(token["_data"]),
        b.strings(top["operationType"]),
        b.strings(ns["db"]),
        b.strings(ns["coll"]),
        numbers((clock >> 32).astype(np.int64) * 1_000_000, TS),
        numbers((clock & 0xFFFFFFFF).astype(np.int64), pa.int64()),
        numbers(b.int64s(wall.offsets) * 1000, TS, wall.where(DATETIME)),
        numbers(txn_values, pa.int64(), np.isin(txn.types, (INT32, INT64))),
        _per_value(b, top["lsid"], DOCUMENT, _document_json),
        b.strings(to["db"]),
        b.strings(to["coll"]),
        _per_value(b, top["collectionUUID"], BINARY, _binary_hex),
        document_keys,
        b.views(docs.starts, docs.sizes, None, pa.binary()),
    ]
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


def _inner(b: BsonBuffer, parent: Located, keys: list[str]) -> dict[str, Located] | None:
    """`keys` located inside the sub-documents at `parent` (absent where there is none)."""
    rows = np.flatnonzero(parent.where(DOCUMENT))
    found = b.locate(parent.offsets[rows], keys)
    if found is None:
        return None
    full = {key: absent(len(parent.types)) for key in keys}
    for key, located in found.items():
        full[key].types[rows] = located.types
        full[key].offsets[rows] = located.offsets
    return full


# Document keys made without a call per event, for an _id alone of these types, exactly as
# libbson writes canonical Extended JSON; any other key goes through bsonjs.
_KEY_FORMS = {
    INT32: (4, '{ "_id" : { "$numberInt" : "', '" } }'),
    INT64: (8, '{ "_id" : { "$numberLong" : "', '" } }'),
    OBJECT_ID: (12, '{ "_id" : { "$oid" : "', '" } }'),
}
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def _document_keys(b: BsonBuffer, located: Located) -> pa.Array | None:
    """The document_key column; None when a key holds what the walk does not size (a regex,
    say in a shard key field): the top-level walk only sized documentKey as a whole."""
    n = len(located.types)
    inner = _inner(b, located, ["_id"])
    if inner is None:
        return None
    key = inner["_id"]
    doc_sizes = b.int32s(located.offsets)
    parts = []
    done = np.zeros(n, bool)
    for bson_type, (width, prefix, suffix) in _KEY_FORMS.items():
        # {_id: v} alone: 4 (size) + 1 (type) + 4 ("_id" and NUL) + the value + 1 (NUL)
        rows = key.where(bson_type) & (doc_sizes == 10 + width)
        if not rows.any():
            continue
        done |= rows
        if bson_type == OBJECT_ID:
            raw = b.rows(np.where(rows, key.offsets, 0), 12)
            digits = np.stack([_HEX[raw >> 4], _HEX[raw & 15]], axis=2).reshape(n, 24)
            offsets = np.arange(0, 24 * n + 1, 24, dtype=np.int32)
            text = pa.Array.from_buffers(
                pa.string(), n, [bitmap(rows), pa.py_buffer(offsets), pa.py_buffer(digits)]
            )
        else:
            read = b.int32s if bson_type == INT32 else b.int64s
            text = numbers(read(np.where(rows, key.offsets, 0)), pa.int64(), rows).cast(pa.string())
        before, after, nothing = (text_scalar(part) for part in (prefix, suffix, ""))
        parts.append(pc.binary_join_element_wise(before, text, after, nothing))
    rest = located.where(DOCUMENT) & ~done
    if rest.any() or not parts:
        parts.append(_per_value(b, located, DOCUMENT, _document_json, rest))
    return parts[0] if len(parts) == 1 else pc.coalesce(*parts)


def _per_value(
    b: BsonBuffer,
    located: Located,
    bson_type: int,
    render: Any,
    only: np.ndarray | None = None,
) -> pa.Array:
    """A string column made value by value, for the rows that hold one (null elsewhere)."""
    wanted = located.where(bson_type) if only is None else only
    rows = np.flatnonzero(wanted)
    if not len(rows):
        return pa.nulls(len(wanted), pa.string())
    values: list[str | None] = [None] * len(wanted)
    offsets = located.offsets[rows]
    sizes = b.int32s(offsets)
    for row, offset, size in zip(rows.tolist(), offsets.tolist(), sizes.tolist(), strict=True):
        values[row] = render(b.raw, offset, size)
    return texts(values)


def _document_json(raw: bytes, offset: int, size: int) -> str:
    return bsonjs.dumps(raw[offset : offset + size], mode=bsonjs.CANONICAL)


def _binary_hex(raw: bytes, offset: int, size: int) -> str:
    return raw[offset + 5 : offset + 5 + size].hex()
