"""What a torture run is asked to do: its settings, its step log and the stream variants it runs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository


CRUD = ["insert", "update", "replace", "delete"]


SNAPSHOT_OPS = ("snapshot", "snapshot_start")


@dataclass
class TortureConfig:
    seed: int
    write_seconds: float = 60.0  # how long the writers write (bounds the workload, not a check)
    busy_ops: tuple[int, int] = (4, 12)  # writes per busy burst, about 8 bursts a second
    max_parallel: int = 3  # scheduled operations running at once
    kill_fraction: float = 0.4  # child runs that get a SIGKILL
    transform_in_child: bool = False  # the soak: transforms in child JVMs, killable too
    # The cluster variant: the children's transforms run on this Spark Connect server (the
    # driver of a standalone cluster); needs transform_in_child.
    spark_remote: str | None = None
    ddl_every: tuple[float, float] = (6.0, 12.0)
    history_lost: bool = False  # the tiny-oplog variant: one stream, rolled past
    streams: tuple[str, ...] = ()  # a subset of the variants, by name; empty: all


@dataclass
class StepLog:
    lines: list[str] = field(default_factory=list)
    clock: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, text: str) -> None:
        with self.lock:
            self.lines.append(f"{time.monotonic() - self.clock:7.2f}s {text}")

    def tail(self, n: int = 80) -> str:
        with self.lock:
            return "\n".join(self.lines[-n:])


# Bytes: every db_a table is made without vectors and gets them at its next MERGE or DELETE,
# if it has one (not asserted: a run's final tables may have had none since they were made).
VECTORS_FROM = 1


def stream_variants(db_a: str, db_b: str) -> dict[str, dict[str, Any]]:
    """Every stream variant, over the same writers, as StreamConfig fields."""
    variants: dict[str, dict[str, Any]] = {
        # Deletion vectors from the first commit (the default leaves the torture's small
        # tables without them), and in db_a from its next MERGE (VECTORS_FROM): the vectors,
        # and the switch to them when it comes, are killed at random too.
        "ords_tiny": {
            "database": db_a,
            "collection": "orders",
            "budget": {"max_events": 50},
            "deletion_vectors_from_bytes": 0,
        },
        # A quiet stream: runs often find nothing, then the next write lands mid-run.
        # Small chunks: the copy's chunk boundaries fall among the MinKey / MaxKey _ids.
        "sparse": {
            "database": db_a,
            "collection": "sparse",
            "max_await_time_ms": 20,
            "snapshot_chunk_size": 3,
        },
        "pre": {
            "database": db_a,
            "collection": "pre",
            "full_document": "required",
            "full_document_before_change": "whenAvailable",
        },
        "ddl_go": {"database": db_a, "collection": "ddl", "on_invalidate": "continue"},
        "ddl_stop": {"database": db_a, "collection": "ddl", "on_invalidate": "stop"},
        "ddl_crud": {
            "database": db_a,
            "collection": "ddl",
            "pipeline": [{"$match": {"operationType": {"$in": CRUD}}}],
        },
        "db_a": {"database": db_a, "deletion_vectors_from_bytes": VECTORS_FROM},
        "db_b": {"database": db_b},
        "cluster": {"pipeline": [{"$match": {"ns.db": {"$in": [db_a, db_b]}}}]},
    }
    # The tiny-oplog variant (its own mongod): the harness rolls the oplog past its position.
    variants["hist"] = {
        "database": db_a,
        "collection": "orders",
        "on_history_lost": "resnapshot",
    }
    variants["hist_db"] = {"database": db_a, "on_history_lost": "resnapshot"}
    quick = {"max_await_time_ms": 100, "snapshot_chunk_size": 200}
    return {name: {"name": name, **quick, **fields} for name, fields in variants.items()}
