"""The merge rule of `current`: how a version's base and deltas read as one table.

A version of `current` is a *base* directory (every row, written by a full fold or a
compaction) followed by zero or more *delta* directories (one per later run: a row for each
key the run changed, an upsert or a tombstone). The rule, the one place it is stated:

    Over the rows of the base and every delta up to the version, keep per key
    (`_tm_db`, `_tm_coll`, `_tm_key`) the row with the greatest `_tm_event_id` (on a tie,
    the later directory's); then drop the rows with `_tm_deleted` (tombstones and
    namespace barriers) to get what readers see.

It is safe because of what the writers guarantee:
- tombstones are never dropped, not even by a compaction, so a late older event of a deleted
  document loses to its tombstone wherever the two meet;
- barrier rows (namespace events: drop, dropDatabase, rename, a snapshot's start; `_tm_key`
  null) only ever appear in a base: a run that folds a namespace event writes a new base
  (`jobs.transform.run`), with the namespace already cleared, so deltas hold keyed rows only;
- a delta row was filtered against its base's barriers when it was written, so no row of a
  cleared namespace comes back through a delta.

Other engines read the newest version by the same rule (SQL in the README); right after a
compaction a version is one base and `_tm_deleted = false` alone is the table.

Document columns are typed in each directory by the schema of the version that wrote it; a
version's schema only ever widens a field (to string), so older directories are read in the
version's schema and a widened field is re-read from the row's plain JSON (`_tm_json`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.transform.doc_columns import JSON_OPTIONS
from jobs.transform.fold import KEY, STATE_COLUMNS
from state import CurrentVersion

DELETED = "_tm_deleted"
_ORDER = "_tm_part"  # which directory a row came from: breaks ties towards the later one
# Helper columns are named `_tm_*`: no document field becomes a column of that name.
_RANK = "_tm_rank"


def quoted(name: str) -> str:
    """A column reference to a field named `name` as is (a document field may hold a dot)."""
    return "`" + name.replace("`", "``") + "`"


def conform(frame: DataFrame, schema: StructType) -> DataFrame:
    """`frame`'s rows as STATE_COLUMNS plus one column per field of `schema`, in that order.

    A column the directory lacks (the field is newer than the directory, or a type Parquet
    cannot hold, such as an empty sub-document) or holds in another type (the field widened
    after the directory was written) is parsed again from `_tm_json`, so a row reads the same
    whichever directory it is in."""
    # One schema lookup (over Spark Connect each is a round trip to the server).
    have = {f.name: f.dataType for f in frame.schema.fields}
    columns: list[Column] = [F.col(c) for c in STATE_COLUMNS if c != DELETED]
    # A version written before tombstones existed has no deleted rows.
    columns.append(F.col(DELETED) if DELETED in have else F.lit(False).alias(DELETED))
    for field in schema.fields:
        if field.name.startswith("_tm_"):
            continue
        if have.get(field.name) == field.dataType:
            column = F.col(quoted(field.name))
        else:
            parsed = F.from_json(F.col("_tm_json"), StructType([field]), JSON_OPTIONS)
            column = parsed.getField(field.name)
        columns.append(column.alias(field.name))
    return frame.select(*columns)


def read_parts(
    spark: SparkSession, lake_root: Path, parts: Sequence[CurrentVersion], schema: StructType
) -> list[DataFrame]:
    """Each directory of a version, conformed to `schema`, tagged with its place in order."""
    return [
        conform(spark.read.parquet(str(lake_root / part.path)), schema).withColumn(
            _ORDER, F.lit(index)
        )
        for index, part in enumerate(parts)
        if part.path is not None
    ]


def merge(frames: Sequence[DataFrame]) -> DataFrame:
    """The rule above, before hiding deleted rows: one row per key (barriers, whose key is
    null, all kept), without the ordering column."""
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    if len(frames) == 1:
        return rows.drop(_ORDER)  # one base: keys are unique already
    newest_first = Window.partitionBy(*KEY).orderBy(
        F.col("_tm_event_id").desc(), F.col(_ORDER).desc()
    )
    barriers = rows.where(F.col("_tm_key").isNull())
    keyed = (
        rows.where(F.col("_tm_key").isNotNull())
        .withColumn(_RANK, F.row_number().over(newest_first))
        .where(F.col(_RANK) == 1)
        .drop(_RANK)
    )
    return keyed.unionByName(barriers).drop(_ORDER)


def row_counts(frame: DataFrame) -> tuple[int, int]:
    """A directory's rows, all of them and the live ones (one aggregate)."""
    written, live = frame.agg(F.count(F.lit(1)), F.count(F.when(~F.col(DELETED), 1))).first() or (
        0,
        0,
    )
    return written, live


def live(frame: DataFrame) -> DataFrame:
    """The rows readers see: documents, without tombstones and barriers."""
    if DELETED not in frame.columns:
        return frame
    return frame.where(~F.col(DELETED)).drop(DELETED)
