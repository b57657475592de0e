"""The type rule's Arrow bodies (jobs.transform.typed_columns): from canonical Extended JSON,
the census of a partition is the census of its documents, and each typed row and its residual
give back the document."""

from __future__ import annotations

import bson
import bsonjs
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from jobs.transform.field_census import census, from_json
from jobs.transform.type_rule import arrow_type, schema_for
from jobs.transform.typed_columns import (
    CENSUS,
    CODEC,
    DELETED,
    RESIDUAL,
    census_batches,
    census_by_namespace_batches,
    typed_struct,
    typed_type,
)
from tests.helpers.typed_rows import row_disagreements
from tests.test_type_rule import documents, norm, rebuild

pytestmark = pytest.mark.fast


def _texts(batch: list) -> pa.Array:
    return pa.array(
        [None if d is None else bsonjs.dumps(bson.encode(d), mode=bsonjs.CANONICAL) for d in batch],
        pa.string(),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), documents), min_size=1, max_size=6), st.integers(1, 3))
def test_a_partitions_census_row_is_the_census_of_its_documents(batch, size):
    texts = _texts(batch)
    parts = [
        pa.RecordBatch.from_arrays([texts.slice(i, size)], ["d"])
        for i in range(0, len(batch), size)
    ]
    (row,) = census_batches(iter(parts))
    (text,) = row.column(CENSUS).to_pylist()
    assert from_json(text) == census([d for d in batch if d])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), documents)),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 3),
)
def test_a_partitions_census_per_collection_names_each_collection_with_its_census(rows, size):
    """One row per collection among the partition's rows (one holding deletes alone too),
    each the census of that collection's documents only."""
    colls = pa.array([coll for coll, _ in rows], pa.string())
    dbs = pa.array(["d"] * len(rows), pa.string())
    texts = _texts([document for _, document in rows])
    parts = [
        pa.RecordBatch.from_arrays(
            [dbs.slice(i, size), colls.slice(i, size), texts.slice(i, size)], ["db", "c", "t"]
        )
        for i in range(0, len(rows), size)
    ]
    (out,) = census_by_namespace_batches(iter(parts))
    columns = [out.column(n).to_pylist() for n in ("db", "coll", CENSUS)]
    found = {(db, coll): from_json(text) for db, coll, text in zip(*columns, strict=True)}
    assert set(found) == {("d", coll) for coll, _ in rows}
    for (_, coll), counted in found.items():
        assert counted == census([d for c, d in rows if c == coll and d])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(documents, min_size=1, max_size=4),
    st.lists(st.one_of(st.none(), documents), max_size=4),
)
def test_each_typed_row_and_its_residual_give_back_the_document(first, batch):
    schema = schema_for(StructType([]), first)
    typed = typed_struct(_texts(batch), schema)
    assert typed.type == pa.struct([*arrow_type(schema), pa.field(RESIDUAL, pa.string())])
    assert typed_type(schema).fieldNames() == [f.name for f in typed.type]
    for document, row in zip(batch, typed.to_pylist(), strict=True):
        residual_text = row.pop(RESIDUAL)
        if document is None:
            assert residual_text == DELETED and not any(v is not None for v in row.values())
            continue
        residual = {} if residual_text is None else bson.decode(bsonjs.loads(residual_text), CODEC)
        kept = {k: v for k, v in row.items() if v is not None}
        assert norm(rebuild(kept, residual, schema)) == norm(document)


@settings(max_examples=150, deadline=None)
@given(st.lists(documents, min_size=1, max_size=4), st.lists(documents, min_size=1, max_size=4))
def test_the_oracles_row_check_passes_typed_rows_and_fails_a_wrong_or_lost_value(first, batch):
    """`tests.helpers.typed_rows` (what the torture and oracle tests hold `current` to) finds
    nothing in the fold's rows, and finds a typed value changed or a residual dropped."""
    schema = schema_for(StructType([]), first)
    texts = _texts(batch)
    columns = schema.fieldNames()
    for text, row in zip(texts.to_pylist(), typed_struct(texts, schema).to_pylist(), strict=True):
        assert row_disagreements(row, text, columns, RESIDUAL) == []
        if row[RESIDUAL] is not None:
            assert row_disagreements({**row, RESIDUAL: None}, text, columns, RESIDUAL)
        scalar = [c for c in columns if isinstance(row[c], bool | int | str)]
        if scalar:
            wrong = {**row, scalar[0]: [row[scalar[0]]]}
            assert row_disagreements(wrong, text, columns, RESIDUAL)


def _nested(depth: int) -> str:
    return '{"a": ' * depth + '{"$numberInt": "1"}' + "}" * depth


@pytest.mark.parametrize(
    "text",
    [
        # MongoDB stores a name repeated at one level as given; a dict keeps one of them.
        '{"_id": {"$numberInt": "1"}, "a": {"$numberInt": "1"}, "a": "two"}',
        # A DBRef-shaped sub-document: Python's DBRef writes $ref before $id.
        '{"_id": {"$numberInt": "2"}, "r": {"$id": {"$numberInt": "1"}, "$ref": "c"}}',
        '{"_id": {"$numberInt": "3"}, "a": {"$symbol": "s"}}',  # decoded as a plain string
        '{"_id": {"$numberInt": "4"}, "a": {"$undefined": true}}',  # decoded as null
        '{"_id": {"$numberInt": "5"}, "a": ' + _nested(98) + "}",  # past libbson's JSON parser
    ],
)
def test_a_document_python_cannot_give_back_exactly_is_kept_whole_in_the_residual(text):
    schema = schema_for(StructType([]), [{"_id": 1, "a": 1, "r": {"x": 1}}])
    row = typed_struct(pa.array([text], pa.string()), schema).to_pylist()[0]
    assert row.pop(RESIDUAL) == text
    assert set(row.values()) == {None}, row  # nothing placed, so nothing half-placed


def test_a_document_python_gives_back_exactly_is_placed():
    text = '{"_id": {"$numberInt": "1"}, "a": {"$numberInt": "1"}, "r": {"x": "y"}}'
    schema = schema_for(StructType([]), [{"_id": 1, "a": 1, "r": {"x": 1}}])
    row = typed_struct(pa.array([text], pa.string()), schema).to_pylist()[0]
    assert row["a"] == 1 and row["r"] == {"x": None}
    assert decoded_residual(row[RESIDUAL]) == {"r": {"x": "y"}}


def decoded_residual(text: str) -> dict:
    return bson.decode(bsonjs.loads(text), CODEC)
