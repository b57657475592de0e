"""Many BSON documents read at once: their top-level fields located with numpy, not per object.

Capture reads server replies with it; the transform finds the documents inside the raw
zone's events with it (`jobs.raw_zone.events_documents`).

A change-stream reply carries a thousand events in one buffer. Decoding each event into a
Python object (even pymongo's lazy RawBSONDocument, whose top level is inflated in C) cost more
client time per event than the server spends producing it. Here the documents are walked in
lockstep: step k reads the k-th element of every document with a few array operations, so the
per-event cost is a handful of array elements. What is read is only located (type and value
offset); `strings`, `int32s`, ... turn located values into Arrow arrays that point into the
same buffer until Arrow copies them.

`elements` is the scalar walk of one document, for the few documents read one at a time (a
getMore reply's envelope). Anything unusual (a regex or an unknown type at the top level, a
length that does not add up) makes `locate` return None, and callers take the per-document
path, which has pymongo's exact behaviour.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import pyarrow as pa
from bson.raw_bson import RawBSONDocument

from resources.mongo import RAW_CODEC

PAD = 32  # the widest fixed read: a key window (longer keys take a slow lane)

# The value's size by BSON type: fixed sizes, or a little-endian int32 at the value plus a base.
_FIXED = np.full(256, -1, np.int64)
for _type, _size in {
    0x01: 8,  # double
    0x06: 0,  # undefined
    0x07: 12,  # ObjectId
    0x08: 1,  # bool
    0x09: 8,  # UTC datetime
    0x0A: 0,  # null
    0x10: 4,  # int32
    0x11: 8,  # Timestamp
    0x12: 8,  # int64
    0x13: 16,  # decimal128
    0xFF: 0,  # MinKey
    0x7F: 0,  # MaxKey
}.items():
    _FIXED[_type] = _size
_LENGTH_BASE = np.full(256, -1, np.int64)  # size = int32 + base
for _type, _base in {
    0x02: 4,  # string: int32 length (with its NUL) + bytes
    0x03: 0,  # document: int32 total size
    0x04: 0,  # array
    0x05: 5,  # binary: int32 length + subtype + bytes
    0x0C: 16,  # DBPointer: string + ObjectId
    0x0D: 4,  # JavaScript code
    0x0E: 4,  # symbol
    0x0F: 0,  # code with scope: int32 total size
}.items():
    _LENGTH_BASE[_type] = _base

STRING, DOCUMENT, ARRAY, BINARY, OBJECT_ID, DATETIME, NULL, INT32, TIMESTAMP, INT64 = (
    0x02,
    0x03,
    0x04,
    0x05,
    0x07,
    0x09,
    0x0A,
    0x10,
    0x11,
    0x12,
)


@dataclass
class Located:
    """Where one key's value is in each document: its BSON type (0: absent) and offset."""

    types: np.ndarray  # uint8 per document
    offsets: np.ndarray  # int64 per document, into the buffer; meaningless where absent

    def where(self, bson_type: int) -> np.ndarray:
        return self.types == bson_type


def absent(n: int) -> Located:
    return Located(np.zeros(n, np.uint8), np.zeros(n, np.int64))


class BsonBuffer:
    """A buffer of BSON seen through unaligned fixed-width views: reading an int32, an int64
    or a 32-byte key window at many offsets is one gather (numpy allows a stride of 1 byte)."""

    def __init__(self, raw: bytes, end: int | None = None) -> None:
        end = len(raw) if end is None else end
        if end + PAD > len(raw):  # every read of up to PAD bytes must stay inside
            raw = raw + bytes(end + PAD - len(raw))
        self.raw = raw
        self.arrow = pa.py_buffer(raw)
        self.u8 = np.frombuffer(raw, np.uint8)
        self._views: dict[str, np.ndarray] = {}

    def _view(self, dtype: str) -> np.ndarray:
        view = self._views.get(dtype)
        if view is None:
            width = np.dtype(dtype).itemsize
            view = np.ndarray((len(self.raw) - width + 1,), dtype, self.raw, 0, (1,))
            self._views[dtype] = view
        return view

    def int32s(self, offsets: np.ndarray) -> np.ndarray:
        return self._view("<i4")[offsets].astype(np.int64)

    def int64s(self, offsets: np.ndarray) -> np.ndarray:
        return self._view("<i8")[offsets]

    def uint64s(self, offsets: np.ndarray) -> np.ndarray:
        return self._view("<u8")[offsets]

    def rows(self, offsets: np.ndarray, width: int) -> np.ndarray:
        """`width` bytes at each offset, one row each (a copy)."""
        return self._view(f"V{width}")[offsets].view(np.uint8).reshape(len(offsets), width)

    def locate(self, starts: np.ndarray, keys: Sequence[str]) -> dict[str, Located] | None:
        """The values of `keys` in the documents starting at `starts`; None if any document
        holds something this walk does not size (then read those documents one by one)."""
        n = len(starts)
        wanted = {key.encode(): key for key in keys}
        found = {key: absent(n) for key in keys}
        if n == 0:
            return found
        sizes = self.int32s(starts)
        ends = starts + sizes - 1  # each document's closing NUL
        if (sizes < 5).any() or (ends + PAD > len(self.raw)).any() or self.u8[ends].any():
            return None
        rows = np.arange(n)
        pos = starts + 4
        columns = np.arange(PAD)
        while True:
            live = pos < ends[rows]
            if not live.all():
                rows, pos = rows[live], pos[live]
                if not len(rows):
                    return found
            types = self.u8[pos]
            window = self.rows(pos + 1, PAD)
            zero = window == 0
            key_lengths = np.argmax(zero, axis=1)
            for row in np.flatnonzero(~zero.any(axis=1)):  # a key longer than the window
                key_lengths[row] = self.raw.index(b"\x00", int(pos[row]) + 1) - int(pos[row]) - 1
            values = pos + 2 + key_lengths
            # Which key each row holds: zero what follows the key, then compare whole rows.
            window[columns >= key_lengths[:, None]] = 0
            keys_here = window.view(f"V{PAD}").ravel()
            if (keys_here == keys_here[0]).all():
                distinct, inverse = keys_here[:1], None
            else:
                distinct, inverse = np.unique(keys_here, return_inverse=True)
            for number, key_bytes in enumerate(distinct):
                name = wanted.get(bytes(key_bytes).rstrip(b"\x00"))
                if name is None:
                    continue
                if inverse is None:
                    found[name].types[rows] = types
                    found[name].offsets[rows] = values
                else:
                    hit = inverse == number
                    found[name].types[rows[hit]] = types[hit]
                    found[name].offsets[rows[hit]] = values[hit]
            size = _FIXED[types]
            base = _LENGTH_BASE[types]
            variable = base >= 0
            if variable.any():
                lengths = self.int32s(values[variable])
                if (lengths < 0).any():
                    return None
                size[variable] = lengths + base[variable]
            if (size < 0).any():  # a type this walk does not size (regex, unknown)
                return None
            pos = values + size
            if (pos > ends[rows]).any():
                return None

    def strings(self, located: Located) -> pa.Array:
        """The BSON strings located, as an Arrow string array (null where absent or not a
        string)."""
        present = located.where(STRING)
        if not present.any():
            return pa.nulls(len(present), pa.string())
        offsets = np.where(present, located.offsets, 0)
        lengths = np.where(present, self.int32s(offsets) - 1, 0)
        return self.views(offsets + 4, lengths, present, pa.string())

    def views(
        self,
        offsets: np.ndarray,
        lengths: np.ndarray,
        present: np.ndarray | None,
        arrow_type: pa.DataType,
    ) -> pa.Array:
        """Slices of the buffer as a string or binary array: built as Arrow's view layout
        over the buffer, then one copy by Arrow into the plain layout."""
        n = len(offsets)
        if (lengths < 0).any() or (offsets + lengths > len(self.raw)).any():
            raise ValueError("a value reaches past its buffer")
        # Each view: the length, then the value inline (up to 12 bytes, zero-padded) or a
        # 4-byte prefix, the data buffer's index (0) and the offset.
        views = np.empty((n, 16), np.uint8)
        views[:, :4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
        views[:, 4:] = self.rows(offsets, 12)
        short = np.flatnonzero(lengths < 12)
        if len(short):
            inline = views[short, 4:]
            inline[np.arange(12) >= lengths[short, None]] = 0
            views[short, 4:] = inline
        long = np.flatnonzero(lengths > 12)
        if len(long):
            views[long, 8:12] = 0
            views[long, 12:] = offsets[long].astype("<i4").view(np.uint8).reshape(-1, 4)
        view_type = pa.string_view() if arrow_type == pa.string() else pa.binary_view()
        array = pa.Array.from_buffers(
            view_type, n, [bitmap(present), pa.py_buffer(views), self.arrow]
        )
        return array.cast(arrow_type)


def bitmap(present: np.ndarray | None) -> pa.Buffer | None:
    """An Arrow validity bitmap (None: all valid)."""
    if present is None or present.all():
        return None
    return pa.py_buffer(np.packbits(present, bitorder="little"))


def numbers(
    values: np.ndarray, arrow_type: pa.DataType, present: np.ndarray | None = None
) -> pa.Array:
    """A numpy int64 array as an Arrow array of `arrow_type` (int64 or a timestamp), without
    `pa.array`, which imports pandas on first use (a second or so)."""
    data = np.ascontiguousarray(values, np.int64)
    return pa.Array.from_buffers(arrow_type, len(data), [bitmap(present), pa.py_buffer(data)])


def texts(values: Sequence[str | None]) -> pa.Array:
    """Python strings (or None) as an Arrow string array, without `pa.array` (see `numbers`)."""
    encoded = [b"" if value is None else value.encode() for value in values]
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    present = np.fromiter((value is not None for value in values), bool, len(values))
    data = pa.py_buffer(b"".join(encoded))
    buffers = [bitmap(present), pa.py_buffer(offsets.astype(np.int32)), data]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def text_scalar(text: str) -> pa.Scalar:
    """A string scalar, without `pa.scalar` (see `numbers`)."""
    return texts([text])[0]


def int64_values(column: pa.ChunkedArray) -> np.ndarray:
    """An int64 (or timestamp) column's values as numpy, without `to_numpy` (see `numbers`);
    nulls read as whatever their slot holds."""
    parts = [
        np.frombuffer(chunk.buffers()[1], np.int64, len(chunk), chunk.offset * 8)
        for chunk in column.cast(pa.int64()).chunks
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def mask(values: np.ndarray) -> pa.Array:
    """A numpy bool array as an Arrow boolean array (see `numbers`)."""
    return pa.Array.from_buffers(
        pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))]
    )


# -- one document at a time ---------------------------------------------------------------

# One value at an offset, for the walks of one document at a time: (value,) tuples.
int32_at = struct.Struct("<i").unpack_from
int64_at = struct.Struct("<q").unpack_from


def elements(raw: bytes, start: int = 0) -> Iterator[tuple[str, int, int, int]]:
    """(key, type, value offset, value size) of each top-level element of one document."""
    end = start + int32_at(raw, start)[0] - 1
    pos = start + 4
    while pos < end:
        bson_type = raw[pos]
        key_end = raw.index(b"\x00", pos + 1)
        value = key_end + 1
        size = int(_FIXED[bson_type])
        if size < 0:
            base = int(_LENGTH_BASE[bson_type])
            if base < 0:
                raise ValueError(f"BSON type {bson_type:#x} is not walked here")
            size = int32_at(raw, value)[0] + base
        yield raw[pos + 1 : key_end].decode(), bson_type, value, size
        pos = value + size


class RawDocuments(Sequence[RawBSONDocument]):
    """Documents that sit in one buffer (a server reply, a chunk): the buffer, where each
    starts and its size. Indexing decodes one document lazily; slicing copies nothing."""

    def __init__(self, buffer: bytes, starts: np.ndarray, sizes: np.ndarray) -> None:
        self.buffer = buffer
        self.starts = starts
        self.sizes = sizes

    @classmethod
    def of(cls, raws: Sequence[bytes]) -> RawDocuments:
        sizes = np.fromiter(map(len, raws), np.int64, len(raws))
        starts = np.zeros(len(raws), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        return cls(b"".join(raws), starts, sizes)

    def bson(self) -> BsonBuffer:
        """The buffer, ready for array reads (padded by a copy if its last document ends too
        close to its end for the fixed-width reads)."""
        end = int((self.starts + self.sizes).max()) if len(self) else 0
        return BsonBuffer(self.buffer, end)

    @property
    def nbytes(self) -> int:
        return int(self.sizes.sum())

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> RawBSONDocument: ...
    @overload
    def __getitem__(self, index: slice) -> RawDocuments: ...
    def __getitem__(self, index: int | slice) -> RawBSONDocument | RawDocuments:
        if isinstance(index, slice):
            return RawDocuments(self.buffer, self.starts[index], self.sizes[index])
        return RawBSONDocument(self.raw(index), RAW_CODEC)

    def raw(self, index: int) -> bytes:
        start = int(self.starts[index])
        return self.buffer[start : start + int(self.sizes[index])]

    def raws(self) -> list[bytes]:
        buffer = self.buffer
        return [
            buffer[s : s + n]
            for s, n in zip(self.starts.tolist(), self.sizes.tolist(), strict=True)
        ]


def array_documents(raw: bytes, value: int) -> RawDocuments:
    """The documents of the BSON array at `value` (say a reply's nextBatch), not decoded.

    An array's keys are "0", "1", ...: each element's layout is known but for the size of its
    document, so the walk reads one int32 per element (and checks the type and the key's
    end, so anything else is an error, not a misread)."""
    end = value + int32_at(raw, value)[0] - 1
    pos = value + 4
    starts: list[int] = []
    sizes: list[int] = []
    index = 0
    while pos < end:
        start = pos + len(str(index)) + 2  # type byte, the index's digits, NUL
        if raw[pos] != DOCUMENT or raw[start - 1] != 0:
            raise ValueError(f"element {index} of the array at {value} is not a document")
        size = int32_at(raw, start)[0]
        starts.append(start)
        sizes.append(size)
        pos = start + size
        index += 1
    if pos != end:
        raise ValueError(f"the array at {value} does not end where its size says")
    return RawDocuments(raw, np.array(starts, np.int64), np.array(sizes, np.int64))
