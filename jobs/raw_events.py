"""Change events (raw BSON) to Arrow: the raw zone's schema and the converter.

The envelope becomes typed columns, the document key canonical Extended JSON, and the whole
event is kept as its BSON bytes, so every table can be rebuilt from the raw zone. The
documents themselves (post- and pre-image, update description) stay inside `raw` here: their
canonical JSON costs more per event than the server takes to produce the event, so it is made
by the transform, in parallel and off the capture path (`document_json`).
"""

from __future__ import annotations

import struct
from datetime import datetime
from typing import Any

import bsonjs
import pyarrow as pa
import pyarrow.compute as pc
from bson.raw_bson import RawBSONDocument

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


def _json(value: Any) -> str | None:
    """Canonical Extended JSON straight from the sub-document's BSON bytes (libbson, in C).

    Nested values of a RawBSONDocument stay undecoded, so no Python object is built for the
    document's fields; the output round-trips to the same bytes (int32 vs int64, -0.0, NaN,
    dates outside Python's range and all).
    """
    if value is None:
        return None
    return bsonjs.dumps(value.raw, mode=bsonjs.CANONICAL)


def event_id(raw: bytes) -> str | None:
    """The token's `_data` read straight from the event's first bytes.

    The server writes `_id: {_data: "<hex>"}` first in every change event; checking each byte
    of that layout makes this exact, and anything else returns None (decode instead).
    """
    if raw[4:9] == b"\x03_id\x00" and raw[13:20] == b"\x02_data\x00":
        length = _INT32(raw, 20)[0]
        if raw[23 + length : 24 + length] == b"\x00":
            return raw[24 : 23 + length].decode()
    return None


_INT32 = struct.Struct("<i").unpack_from


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
        c["lsid"].append(_json(lsid) if lsid is not None else None)
        to = doc.get("to")
        c["to_db"].append(to.get("db") if to is not None else None)
        c["to_coll"].append(to.get("coll") if to is not None else None)
        uuid = doc.get("collectionUUID")
        c["collection_uuid"].append(bytes(uuid).hex() if uuid is not None else None)
        c["document_key"].append(_json(doc.get("documentKey")))
        c["raw"].append(raw)
        self.nbytes += len(raw)

    def to_table(self) -> pa.Table:
        seconds = pa.array(self.columns["cluster_time"], pa.int64())
        columns = dict(self.columns)
        columns["cluster_time"] = pc.multiply(seconds, 1_000_000).cast(TS)
        return pa.Table.from_pydict(columns, schema=RAW_SCHEMA)


DOCUMENT_FIELDS = {
    "full_document": "fullDocument",
    "full_document_before_change": "fullDocumentBeforeChange",
    "update_description": "updateDescription",
    "operation_description": "operationDescription",
}


def document_json(raw: bytes) -> tuple[str | None, ...]:
    """The canonical Extended JSON of an event's documents, in DOCUMENT_FIELDS order."""
    event = RawBSONDocument(raw)
    return tuple(_json(event.get(field)) for field in DOCUMENT_FIELDS.values())
