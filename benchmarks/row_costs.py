"""Per-row costs of the transform's document work, in plain Python and inside Spark.

    .venv/bin/python -m benchmarks.row_costs                        # 200k documents of ~0.5 KB
    .venv/bin/python -m benchmarks.row_costs --documents 3000 --master local[2]   # smoke

Builds insert change events as a server lays them out (`bson.encode` of the event, the
documents of `benchmarks.drain.document`), so no mongod is needed, and times each per-row step
of the transform: once as a plain Python loop (the function alone) and once inside Spark over
Parquet inputs (the UDF or JVM expression, the Python worker round trip and the scan included;
the scans alone have rows of their own). Each row has the wall time and the CPU time (this
process and its descendants: Spark's JVM and Python workers), which stays put when others
use the shared cores; Spark rows are the best of `--repeats`. Steps a checkout does not have
print `-`. Prints markdown tables; the SparkSession's start is not counted.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import random
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bson
import pyarrow as pa
import pyarrow.parquet as pq
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from benchmarks.drain import document


def insert_event(n: int, full: dict[str, Any]) -> bytes:
    """An insert change event as the server sends it (resume token, namespace, key, image)."""
    return bson.encode(
        {
            "_id": {
                "_data": f"82{1_700_000_000 + n // 1000:08X}{n % 1000:08X}2B022C0100296E5A1004"
            },
            "operationType": "insert",
            "clusterTime": Timestamp(1_700_000_000 + n // 1000, n % 1000 + 1),
            "wallTime": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=n),
            "fullDocument": full,
            "ns": {"db": "bench", "coll": "orders"},
            "documentKey": {"_id": full["_id"]},
        }
    )


def _optional(module: str, name: str) -> Any:
    """A function this checkout may not have (the before/after runs share this script)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _per_row(fn: Callable[[Any], Any] | None, values: list[Any]) -> tuple[float, float] | None:
    """(wall, CPU) seconds of a loop; the CPU time stays put when the shared machine is busy."""
    if fn is None:
        return None
    began, cpu = time.perf_counter(), time.process_time()
    for value in values:
        fn(value)
    return time.perf_counter() - began, time.process_time() - cpu


def tree_cpu_seconds() -> float:
    """CPU time of this process and all its descendants (Spark's JVM, its Python workers),
    reaped children included: what a step cost the machine, whatever else runs on it."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            # After the name: state, ppid, ..., utime stime cutime cstime at 11..14.
            stats[int(entry.name)] = (int(fields[1]), sum(map(int, fields[11:15])) / tick)
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo += children.get(pid, [])
    return total


def _module(name: str) -> Any:
    """A module this checkout may not have (None)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _type_rule_steps(canonical: list[str]) -> list[tuple]:
    """The type rule's per-row work (`typed_columns`), where this checkout has it."""
    typed = _module("jobs.transform.typed_columns")
    if typed is None:
        return [("census / place: the type rule", canonical, None)]
    from jobs.transform.field_census import census
    from jobs.transform.type_rule import place, schema_from

    documents = typed.decoded(pa.array(canonical))
    schema = schema_from(_empty_schema(), census(documents))
    return [
        (
            "decode: canonical Extended JSON -> BSON values",
            canonical,
            lambda c: typed.decoded(pa.array([c])),
        ),
        ("census: one document counted", documents, lambda d: census([d])),
        ("place: one document -> typed values + residual", documents, lambda d: place(d, schema)),
    ]


def _empty_schema() -> Any:
    from pyspark.sql.types import StructType

    return StructType([])


def python_steps(raws: list[bytes], canonical: list[str]) -> list[tuple]:
    """(step, rows, seconds) of each function alone, in a plain loop."""
    from jobs.raw_zone import document_json

    flatten = _optional("jobs.transform.extjson", "flatten")
    plain_json = _optional("jobs.transform.extjson", "plain_json")
    fulls = [bytes(RawBSONDocument(r)["fullDocument"].raw) for r in raws]
    rows: list[tuple] = [
        ("document_json: event BSON -> canonical Extended JSON (4 fields)", raws, document_json),
        *_type_rule_steps(canonical),
        ("flatten: canonical Extended JSON -> plain JSON", canonical, flatten),
        ("plain_json: document BSON -> plain JSON", fulls, plain_json),
        (
            "documents_json: event BSON -> canonical + plain JSON, one pass",
            raws,
            _optional("jobs.transform.doc_columns", "documents_json"),
        ),
    ]
    return [(label, len(values), _per_row(fn, values)) for label, values, fn in rows]


def _write_inputs(work: Path, raws: list[bytes], canonical: list[str], plain: list[str]) -> None:
    """The steps' inputs as Parquet, in several files so every core gets tasks."""
    n = len(raws)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    table = pa.table(
        {
            "raw": pa.array(raws, pa.binary()),
            "_tm_db": pa.array(["bench"] * n),
            "_tm_coll": pa.array(["orders"] * n),
            "_tm_key": pa.array([f'{{ "_id" : {{ "$numberInt" : "{i}" }} }}' for i in range(n)]),
            "_tm_document": pa.array(canonical),
            "_tm_event_id": pa.array([f"{i:016d}" for i in range(n)]),
            "_tm_cluster_time": pa.array([start] * n, pa.timestamp("us", tz="UTC")),
            "_tm_json": pa.array(plain),
            "_tm_deleted": pa.array([False] * n),
        }
    )
    files = 8
    (work / "input").mkdir()
    for part in range(files):
        lo, hi = part * n // files, (part + 1) * n // files
        pq.write_table(table.slice(lo, hi - lo), work / "input" / f"part-{part}.parquet")


def _noop(frame: Any) -> None:
    frame.write.format("noop").mode("overwrite").save()


def spark_steps(spark: Any, work: Path, repeats: int) -> list[tuple]:
    """(step, rows, seconds) of each step inside Spark, over the Parquet inputs: the best of
    `repeats` runs (the first also starts Python workers; the machine is shared)."""
    from pyspark.sql import functions as F

    doc_columns = _module("jobs.transform.doc_columns")
    typed = _module("jobs.transform.typed_columns")
    infer = doc_columns and getattr(doc_columns, "infer_schema", None)
    frame = spark.read.parquet(str(work / "input"))
    rows = frame.count()
    raw = frame.select("raw")
    state = frame.drop("raw")
    state_no_json = state.withColumn("_tm_json", F.lit(None).cast("string"))
    documents_udf = getattr(doc_columns, "documents_udf", None)
    document_json_udf = _optional("jobs.transform.change_log", "document_json_udf") or getattr(
        doc_columns, "document_json_udf", None
    )
    variant = F.expr("schema_of_variant_agg(try_parse_json(_tm_json))")
    timed: list[tuple[str, Callable[[], Any] | None]] = [
        ("scan of the raw column alone", lambda: _noop(raw)),
        (
            "document_json_udf: raw -> 4 canonical fields",
            lambda: _noop(raw.select(document_json_udf(F.col("raw")))),
        ),
        (
            "documents_udf: raw -> 4 canonical fields + plain JSON, one pass",
            documents_udf and (lambda: _noop(raw.select(documents_udf(F.col("raw"))))),
        ),
        ("scan of the state columns", lambda: _noop(state)),
        (
            "run_census: the documents' census (mapInArrow), added on the driver",
            typed and (lambda: _census(typed, state)),
        ),
        (
            "with_typed_columns: canonical -> typed columns + residual (Arrow UDF)",
            typed and (lambda: _noop(_typed(typed, state))),
        ),
        (
            "with_json: flatten_udf, canonical -> plain JSON",
            infer and (lambda: _noop(doc_columns.with_json(state_no_json))),
        ),
        (
            "infer_schema over the plain JSON",
            infer and (lambda: _infer(spark, doc_columns, state, work)),
        ),
        (
            "(evaluated) schema_of_variant_agg(try_parse_json) over the plain JSON",
            infer and (lambda: state.select(variant).collect()),
        ),
        ("expand: from_json into typed columns", infer and (lambda: _expand(doc_columns, state))),
    ]
    results = []
    for label, step in timed:
        if step is None:
            results.append((label, rows, None))
            continue
        best = (float("inf"), float("inf"))
        for _ in range(repeats):
            began, cpu = time.perf_counter(), tree_cpu_seconds()
            step()
            wall, used = time.perf_counter() - began, tree_cpu_seconds() - cpu
            best = (min(best[0], wall), min(best[1], used))
        results.append((label, rows, best))
    return results


_SCHEMA: dict[str, Any] = {}


def _census(typed: Any, state: Any) -> None:
    from jobs.transform.type_rule import schema_from

    _SCHEMA["typed"] = schema_from(_empty_schema(), typed.run_census(state.select("_tm_document")))


def _typed(typed: Any, state: Any) -> Any:
    if "typed" not in _SCHEMA:
        _census(typed, state)
    return typed.with_typed_columns(state, _SCHEMA["typed"], ["_tm_key"])


def _infer(spark: Any, doc_columns: Any, state: Any, work: Path) -> None:
    # A checkout from before the file-free inference takes a scratch directory.
    takes_scratch = "scratch" in inspect.signature(doc_columns.infer_schema).parameters
    scratch = (work / "scratch",) if takes_scratch else ()
    _SCHEMA["schema"] = doc_columns.infer_schema(spark, state.select("_tm_json"), *scratch)


def _expand(doc_columns: Any, state: Any) -> None:
    # Checkouts since the change log's columns were kept beside the fields name them.
    keep = ([],) if "keep" in inspect.signature(doc_columns.expand).parameters else ()
    _noop(doc_columns.expand(state, _SCHEMA["schema"], *keep))


def _table(title: str, results: list[tuple]) -> list[str]:
    lines = [
        f"### {title}\n",
        "| step | rows | wall s | CPU s | CPU µs/row |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, rows, times in results:
        if times is None:
            lines.append(f"| {label} | {rows:,} | - | - | - |")
        else:
            wall, cpu = times
            lines.append(
                f"| {label} | {rows:,} | {wall:.2f} | {cpu:.2f} | {cpu / rows * 1e6:.1f} |"
            )
    return lines


def run(args: argparse.Namespace) -> str:
    from jobs.raw_zone import document_json
    from resources.spark import SparkConfig, spark_session, stop_if_created

    rng = random.Random(args.seed)
    filler = max(0, int(args.doc_kb * 1024) - 420)
    raws = [insert_event(n, document(rng, n, filler)) for n in range(args.documents)]
    canonical = [document_json(r)[0] for r in raws]
    flatten = _optional("jobs.transform.extjson", "flatten")
    plain = [flatten(c) if flatten else None for c in canonical]
    size = sum(map(len, raws)) / len(raws)
    lines = _table(
        f"Python, one row at a time ({args.documents:,} insert events of {size:,.0f} bytes)",
        python_steps(raws, canonical),
    )
    with tempfile.TemporaryDirectory(prefix="tidemark-rows-") as tmp:
        work = Path(tmp)
        _write_inputs(work, raws, canonical, plain)
        del raws, canonical, plain
        started = time.perf_counter()
        spark, created = spark_session(SparkConfig(master=args.master, driver_memory="4g"))
        spark.range(1).count()
        jvm = time.perf_counter() - started
        try:
            results = spark_steps(spark, work, args.repeats)
        finally:
            stop_if_created(spark, created)
    lines += [""]
    lines += _table(
        f"Spark (master {args.master}; SparkSession start {jvm:.1f} s, not counted)", results
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--doc-kb", type=float, default=0.5)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="Spark steps: the best of N")
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
