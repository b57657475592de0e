"""What a run's documents say about their fields, counted so that parts add up (issue 38).

The type rule (`type_rule.schema_for`) gives a new field its column from the values a run
brings. Spark folds a run in partitions, and a repeated run must choose the same columns, so
the choice may depend only on the run's values, never on their order or on how they were
split: each partition counts its documents (`census`), the counts are added (`merge`, which is
commutative and associative), and the schema is decided from the sum.

Per field: how many values of each kind (`KINDS`; other BSON types are counted as `other`), a
summary of its numbers (what `number_columns.column_for` needs), and the same counts for the
fields of its sub-documents and for the items of its arrays. A census is plain JSON
(`to_json`, `from_json`) to cross from Spark's workers to the driver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from pyspark.sql.types import DataType, DecimalType, DoubleType, LongType

from jobs.curated_zone import CHANGE_FEED_NAMES, OWN_PREFIX
from jobs.transform.number_columns import MAX_DIGITS, number_type

# Ties between kinds are broken in this order (most values wins first).
KINDS = ["boolean", "number", "string", "objectId", "date", "binary", "document", "array"]
OTHER = "other"  # a BSON type with no column (regex, timestamps, MinKey, code, UUIDs, ...)


def kind_of(value: Any) -> str:
    """The kind of a non-null value (`KINDS`, or `OTHER`)."""
    kind = _KIND_OF_TYPE.get(type(value))
    return kind if kind is not None else _kind_of_subclass(value)


def _kind_of_subclass(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | Int64 | float | Decimal128):
        return "number"
    if isinstance(value, ObjectId):
        return "objectId"
    if type(value) is str:  # not Code, a str of its own
        return "string"
    if isinstance(value, datetime):
        return "date"
    if type(value) is bytes:  # subtype 0; a UUID or other subtype is a Binary
        return "binary"
    if isinstance(value, dict):
        return "document"
    if isinstance(value, list):
        return "array"
    return OTHER


# The types BSON decodes to, by exact type: most values need no isinstance chain.
_KIND_OF_TYPE: dict[type, str] = {
    bool: "boolean",
    int: "number",
    Int64: "number",
    float: "number",
    Decimal128: "number",
    ObjectId: "objectId",
    str: "string",
    datetime: "date",
    bytes: "binary",
    dict: "document",
    list: "array",
}


@dataclass
class Numbers:
    """What a field's numbers say about their column (`number_columns.column_for`)."""

    typed: bool = False  # a number some column type holds
    double: bool = False
    scale: int | None = None  # the largest scale of its decimals

    def add(self, value: Any) -> None:
        if type(value) is float:  # the common cases, as `number_type` types them
            self.typed = self.double = True
            return
        if type(value) is int or type(value) is Int64:
            self.typed = True
            return
        kind = number_type(value)
        if kind is None:
            return
        self.typed = True
        self.double |= isinstance(kind, DoubleType)
        if isinstance(kind, DecimalType):
            self.scale = max(self.scale or 0, kind.scale)

    def merge(self, other: Numbers) -> Numbers:
        scales = [s for s in (self.scale, other.scale) if s is not None]
        return Numbers(
            self.typed or other.typed, self.double or other.double, max(scales, default=None)
        )

    def column(self) -> DataType | None:
        if not self.typed:
            return None
        if self.double:
            return DoubleType()
        if self.scale is not None:
            return DecimalType(MAX_DIGITS, self.scale)
        return LongType()


@dataclass
class FieldCensus:
    """One field's values in a run: counted by kind, with its sub-fields and array items."""

    kinds: dict[str, int] = field(default_factory=dict)
    numbers: Numbers = field(default_factory=Numbers)
    fields: dict[str, FieldCensus] = field(default_factory=dict)  # of its sub-documents
    items: FieldCensus | None = None  # of its arrays' items

    def add(self, value: Any) -> None:
        if value is None:
            return
        kind = kind_of(value)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind == "number":
            self.numbers.add(value)
        elif kind == "document":
            add_document(self.fields, value)
        elif kind == "array":
            self.items = self.items or FieldCensus()
            for item in value:
                self.items.add(item)

    def kind(self) -> str | None:
        """The kind with the most values (ties: `KINDS` order, then `OTHER`); None: none."""
        if not self.kinds:
            return None
        order = [*KINDS, OTHER]
        return max(self.kinds, key=lambda k: (self.kinds[k], -order.index(k)))

    def merge(self, other: FieldCensus) -> FieldCensus:
        kinds = dict(self.kinds)
        for kind, count in other.kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
        items = self.items if other.items is None else other.items
        if self.items is not None and other.items is not None:
            items = self.items.merge(other.items)
        return FieldCensus(
            kinds, self.numbers.merge(other.numbers), merge_census(self.fields, other.fields), items
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": self.kinds,
            "numbers": [self.numbers.typed, self.numbers.double, self.numbers.scale],
            "fields": {name: f.to_dict() for name, f in self.fields.items()},
            "items": None if self.items is None else self.items.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FieldCensus:
        items = data["items"]
        return cls(
            dict(data["kinds"]),
            Numbers(*data["numbers"]),
            {name: cls.from_dict(f) for name, f in data["fields"].items()},
            None if items is None else cls.from_dict(items),
        )


Census = dict[str, FieldCensus]  # a document level's fields by name


def reserved(lowered: str) -> bool:
    """Whether a field name (lower-cased) is one no column may have: Tidemark's own, or one
    Delta's change data feed reads into its own columns."""
    return lowered.startswith(OWN_PREFIX) or lowered in CHANGE_FEED_NAMES


def every_name_a_column(document: dict[str, Any]) -> bool:
    """Whether `column_names` keeps every name of this level (the common case, checked
    fast): none reserved, no two differing only in case."""
    lowered = {name.lower() for name in document}
    return len(lowered) == len(document) and not any(reserved(n) for n in lowered)


def column_names(document: dict[str, Any]) -> list[str]:
    """The names of one document level that may have columns: not `reserved`, and of names
    differing only in case, the document's first (Delta holds names regardless of case)."""
    if every_name_a_column(document):
        return list(document)
    taken: set[str] = set()
    names = []
    for name in document:
        if name.lower() in taken:
            continue
        taken.add(name.lower())
        if not reserved(name.lower()):
            names.append(name)
    return names


def add_document(census: Census, document: dict[str, Any]) -> None:
    for name in column_names(document):
        census.setdefault(name, FieldCensus()).add(document[name])


def census(documents: list[dict[str, Any]]) -> Census:
    """The documents' fields, counted."""
    counted: Census = {}
    for document in documents:
        add_document(counted, document)
    return counted


def merge_census(a: Census, b: Census) -> Census:
    """The census of two parts' documents together."""
    merged = dict(a)
    for name, counted in b.items():
        merged[name] = merged[name].merge(counted) if name in merged else counted
    return merged


def to_json(counted: Census) -> str:
    return json.dumps({name: f.to_dict() for name, f in counted.items()}, sort_keys=True)


def from_json(text: str) -> Census:
    return {name: FieldCensus.from_dict(f) for name, f in json.loads(text).items()}
