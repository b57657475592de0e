"""The torture harness: steady writers, a seeded scheduler of real pipeline runs, and an oracle.

Writers keep writing (a busy collection, a sparse one, a pre-image one, DDL on another, and a
second database that is dropped now and then) while a seeded scheduler starts drains,
replays, resnapshots, gc and transforms, several at a time, in this process or in child
processes that it SIGKILLs at random moments. A monitor thread samples every stream's stored
checkpoint. After the writers stop and one clean run of each step, the oracle checks:

1. every collection's `current` Delta table, read with `deltalake` (no JVM, no Tidemark code)
   from the tables the state store records, equals `find()` for every namespace in scope (or,
   for streams that stopped at an invalidate or hide DDL with `$match`, a pure-Python fold of
   the reference events);
2. the `changes` tables hold exactly the events a plain `watch()` returns over the covered
   ranges (incremental segments between explicit moves, plus replay windows): none missing,
   none twice;
3. every file a committed raw batch lists exists;
4. no stored token (sampled, or a batch's `token_after`) covered an event that was not in an
   incremental batch committed by then.

Run as a module, it is the child process: `python -m tests.helpers.torture child KIND ...`.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bson
from bson import MaxKey, MinKey, ObjectId
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from jobs.capture import drain
from jobs.ops import collect_garbage, reset_stream
from resources.mongo import cluster_time, oplog_window
from state import StateStore, TransformState
from tests.helpers.delta_reading import current_tables, query
from tests.helpers.lake_reading import read_parquet
from tests.helpers.oracle import burst, canonical, make_doc
from tidemark.config import StreamConfig
from tidemark.errors import LeaseHeld, StreamInvalidated, TidemarkError
from tidemark.object_path import LakePath
from tidemark.pipeline_stages import ALWAYS_PASSING_EVENTS
from tidemark.settings import lake_path
from tidemark.tokens import (
    covered_until,
    is_high_water_mark,
    pack_ts,
    token_from_json,
    unpack_ts,
)

ROOT = Path(__file__).resolve().parent.parent.parent
CRUD = ["insert", "update", "replace", "delete"]
SNAPSHOT_OPS = ("snapshot", "snapshot_start")


# -- configuration ---------------------------------------------------------------------------


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


def stream_variants(db_a: str, db_b: str) -> dict[str, dict[str, Any]]:
    """Every stream variant, over the same writers, as StreamConfig fields."""
    variants: dict[str, dict[str, Any]] = {
        "ords_tiny": {"database": db_a, "collection": "orders", "budget": {"max_events": 50}},
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
        "db_a": {"database": db_a},
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


# -- writers ---------------------------------------------------------------------------------

SPARSE_KEYS: list[Any] = [1, 2, 3, "a", "b", ObjectId("5f0000000000000000000001"), 4.5e9]
EDGE_KEYS: list[Any] = [MinKey(), MaxKey()]


class Writers:
    """The steady writers; each has its own seeded random stream and counts its writes."""

    def __init__(self, client: MongoClient, db_a: str, db_b: str, cfg: TortureConfig, log: StepLog):
        self.client, self.db_a, self.db_b, self.cfg, self.log = client, db_a, db_b, cfg, log
        self.stop = threading.Event()
        self.writes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self.ddl_times: list[tuple[str, float]] = []  # (database, wall time) of each DDL event

    def seed_edges(self, rng: random.Random) -> None:
        """MinKey and MaxKey _ids, written before any replay window can start: only a
        snapshot can bring them into `current`."""
        self.client[self.db_a].sparse.insert_many([make_doc(rng, k) for k in EDGE_KEYS])

    def seed(self, rng: random.Random) -> None:
        """Data that exists before any stream starts: replays of windows before the streams'
        start fold these inserts after the deletes the streams saw."""
        a = self.client[self.db_a]
        a.orders.insert_many([make_doc(rng, k) for k in range(300)])
        a.create_collection("pre", changeStreamPreAndPostImages={"enabled": True})
        a.pre.insert_many([make_doc(rng, k) for k in range(100)])
        a.sparse.insert_many([make_doc(rng, k) for k in SPARSE_KEYS])
        a.ddl.insert_many([make_doc(rng, k) for k in range(50)])
        self.client[self.db_b].x.insert_many([make_doc(rng, k) for k in range(50)])
        self.writes["seed"] += 1

    def start(self) -> None:
        for name, body in (("busy", self._busy), ("sparse", self._sparse), ("ddl", self._ddl)):
            rng = random.Random(f"{self.cfg.seed}-{name}")
            thread = threading.Thread(target=self._guard, args=(name, body, rng), daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _guard(self, name: str, body: Callable[[random.Random], None], rng: random.Random) -> None:
        try:
            body(rng)
        except Exception as exc:  # a writer failing is a harness problem: say it loudly
            self.errors.append(f"writer {name}: {exc!r}")
            self.log.add(f"WRITER {name} FAILED: {exc!r}")

    def _busy(self, rng: random.Random) -> None:
        while not self.stop.wait(rng.uniform(0.05, 0.2)):
            coll = "pre" if rng.random() < 0.25 else "orders"
            self.writes[coll] += burst(
                self.client, self.db_a, coll, rng, rng.randint(*self.cfg.busy_ops)
            )

    def _sparse(self, rng: random.Random) -> None:
        coll = self.client[self.db_a].sparse
        while not self.stop.wait(rng.uniform(0.1, 0.5)):
            # MinKey rarely and MaxKey never: a snapshot after their last change must copy them.
            key = MinKey() if rng.random() < 0.02 else rng.choice(SPARSE_KEYS)
            roll = rng.random()
            if roll < 0.3:
                coll.replace_one({"_id": key}, make_doc(rng, key), upsert=True)
            elif roll < 0.5:
                coll.update_one({"_id": key}, {"$set": {"n": rng.choice([1, "one", 1.5, None])}})
            elif roll < 0.6:
                coll.update_one({"_id": key}, {"$unset": {"mixed": ""}})
            elif roll < 0.7:
                coll.update_one({"_id": key}, {"$push": {"arr": rng.randint(0, 9)}})
            elif roll < 0.85 and not isinstance(key, MinKey):
                coll.delete_one({"_id": key})
            else:
                coll.insert_one(make_doc(rng, ObjectId()))
            self.writes["sparse"] += 1

    def _ddl(self, rng: random.Random) -> None:
        a, b = self.client[self.db_a], self.client[self.db_b]
        next_ddl = time.monotonic() + rng.uniform(*self.cfg.ddl_every)
        while not self.stop.wait(rng.uniform(0.05, 0.25)):
            self._ddl_writes(rng, a, b)
            if time.monotonic() >= next_ddl:
                self._ddl_event(rng, a, b)
                next_ddl = time.monotonic() + rng.uniform(*self.cfg.ddl_every)

    def _ddl_writes(self, rng: random.Random, a: Any, b: Any) -> None:
        target = a.ddl if rng.random() < 0.6 else b[rng.choice(["x", "y"])]
        roll = rng.random()
        key = rng.randrange(60)
        if roll < 0.35:
            target.replace_one({"_id": key}, make_doc(rng, key), upsert=True)
        elif roll < 0.55:
            target.update_many({"_id": {"$lt": rng.randrange(60)}}, {"$inc": {"v": 1}})
        elif roll < 0.65:
            target.delete_many({"_id": {"$gte": key, "$lt": key + 5}})
        elif roll < 0.75:
            target.update_one({"_id": key}, {"$set": {"n": str(key)}, "$unset": {"tags": ""}})
        else:
            target.insert_one(make_doc(rng, f"k{rng.randrange(10**6)}"))
        self.writes["ddl"] += 1

    def _ddl_event(self, rng: random.Random, a: Any, b: Any) -> None:
        roll = rng.random()
        at = time.time()
        if roll < 0.35:
            a.ddl.drop()
            a.ddl.insert_many([make_doc(rng, k) for k in range(0, 60, 4)])
            what = "drop+recreate ddl"
        elif roll < 0.7:
            if "ddl" in a.list_collection_names():
                a.ddl.rename("ddl_r", dropTarget=True)
            a.ddl.insert_many([make_doc(rng, k) for k in range(0, 60, 5)])
            what = "rename ddl->ddl_r + recreate"
        else:
            self.client.drop_database(self.db_b)
            b.x.insert_many([make_doc(rng, k) for k in range(0, 60, 3)])
            what = "dropDatabase b + recreate"
        self.writes["ddl_events"] += 1
        self.ddl_times.append((self.db_b if what.startswith("dropDatabase") else self.db_a, at))
        self.log.add(f"writer: {what}")


# The child's Spark Connect server (the cluster variant).
REMOTE_ENV = "TIDEMARK_TORTURE_SPARK_REMOTE"


# -- child processes -------------------------------------------------------------------------


def child_main(argv: list[str]) -> None:
    """`child KIND URI STATE_URL LAKE STREAM_JSON [START END]`: one run, to be killed."""
    kind, uri, state_url, lake, stream_json = argv[:5]
    stream = StreamConfig.model_validate_json(stream_json)
    store = StateStore(state_url)
    from resources.mongo import connect

    if kind in ("transform", "compact"):
        from resources.spark import SparkConfig, prepare_connect_mode, spark_session

        # A cluster's Connect server (the cluster variant), else a JVM of the child's own.
        remote = os.environ.get(REMOTE_ENV)
        prepare_connect_mode(remote)  # before the transform's UDFs are defined
        from jobs.transform import compact, transform

        config = SparkConfig(master="local[1]", driver_memory="1g", remote=remote)
        spark, _ = spark_session(config)
        (transform if kind == "transform" else compact)(spark, store, lake_path(lake), stream)
        return
    client = connect(uri, raw=True)
    if kind == "replay":
        from jobs.capture import replay
        from jobs.capture import writer as raw_writer

        # Small files, so a replay has uncommitted files on disk for most of its run, as a
        # window of more than FLUSH_ROWS events has in production.
        defaults = list(raw_writer.RawBatchWriter.__init__.__defaults__ or ())
        if defaults:
            defaults[0] = 100
            raw_writer.RawBatchWriter.__init__.__defaults__ = tuple(defaults)
        start, end = (datetime.fromisoformat(v) for v in argv[5:7])
        replay(stream, client, store, lake_path(lake), start, end)
        return
    drain(stream, client, store, lake_path(lake), flush_rows=100, resnapshot=kind == "resnapshot")


def run_child(args: list[str], kill_after: float | None, env: dict[str, str]) -> tuple[str, str]:
    """Run a child; SIGKILL it after `kill_after` seconds if still alive. Returns (outcome, err)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.torture", "child", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = False
    if kill_after is not None:
        try:
            child.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            killed = True
    _, err = child.communicate(timeout=600)
    if killed:
        return "killed", ""
    if child.returncode == 0:
        return "ok", ""
    last = [line for line in err.strip().splitlines() if line.strip()]
    return "error", (last[-1] if last else f"exit {child.returncode}")[:300]


# -- the run ---------------------------------------------------------------------------------

# Errors a run may rightly end with when other runs overlap it, a window is not replayable,
# or a stop stream met its invalidate.
EXPECTED_ERRORS = {
    "LeaseHeld",
    "ReplayRefused",
    "StreamInvalidated",
    "CheckpointConflict",
    "TransformConflict",
    "LeaseLost",
    # The tiny-oplog variant: the oplog may roll past a copy made after lost history before
    # the stream goes on from it; the next run copies again (the oracle checks the end state).
    "SnapshotOutrun",
}
FOLD_STREAMS = {"ddl_stop", "ddl_crud"}  # compared with a Python fold, never resnapshotted


@dataclass
class Sample:
    stream: str
    at: datetime  # taken after the read, so every commit the read saw happened before it
    token: str


@dataclass
class RunStats:
    runs: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)


class Torture:
    """One torture run against one mongod, state store and lake; see the module docstring."""

    def __init__(
        self,
        uri: str,
        lake: Path,
        state_url: str,
        cfg: TortureConfig,
        spark: Any = None,
        log: StepLog | None = None,
    ) -> None:
        from resources.mongo import connect

        self.uri, self.lake, self.state_url, self.cfg, self.spark = uri, lake, state_url, cfg, spark
        self.client = connect(uri)
        self.raw = connect(uri, raw=True)
        self.store = StateStore(state_url)
        self.log = log or StepLog()
        self.rng = random.Random(cfg.seed)
        tag = uuid.uuid4().hex[:6]
        self.db_a, self.db_b = f"tt{cfg.seed % 10000}_{tag}_a", f"tt{cfg.seed % 10000}_{tag}_b"
        variants = stream_variants(self.db_a, self.db_b)
        hist = ("hist", "hist_db")
        chosen = cfg.streams or (hist if cfg.history_lost else tuple(set(variants) - set(hist)))
        chosen = tuple(n for n in variants if n in chosen)
        self.streams = {n: StreamConfig.model_validate(variants[n]) for n in chosen}
        self.writers = Writers(self.client, self.db_a, self.db_b, cfg, self.log)
        self.stats = RunStats()
        self.samples: list[Sample] = []
        self.final_errors: dict[str, str] = {}
        self.reset_starts: dict[str, list[int]] = {}
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if cfg.spark_remote:
            self.env[REMOTE_ENV] = cfg.spark_remote
        self._stop_monitor = threading.Event()
        self.t0: datetime = datetime.now(UTC)

    # -- phases ----------------------------------------------------------------------------

    def run(self) -> None:
        self.log.add(f"seed {self.cfg.seed}: databases {self.db_a}, {self.db_b}")
        self.writers.seed_edges(random.Random(f"{self.cfg.seed}-edges"))
        self.t0 = self._first_second()
        self.writers.seed(random.Random(f"{self.cfg.seed}-seed"))
        time.sleep(1.1)  # the streams start a clock second after the seed: replays go before
        self._start_streams()
        monitor = threading.Thread(target=self._monitor, daemon=True)
        monitor.start()
        self.writers.start()
        loops = [
            threading.Thread(target=self._loop, args=(name, body), daemon=True)
            for name, body in (("race", self._race), ("gc_loop", self._gc_loop))
        ]
        for loop in loops:
            loop.start()
        self._schedule()
        for loop in loops:
            loop.join()
        self.log.add(f"writers stopped: {dict(self.writers.writes)}")
        self._settle()
        self._stop_monitor.set()
        monitor.join()

    def _first_second(self) -> datetime:
        """The first whole second after the oplog's first entry and before any seed write:
        replay windows may start there (earlier ones are refused, rightly)."""
        window = oplog_window(self.client)
        first = window.first.time + 1 if window is not None else 0
        # An idle server's cluster time lags the wall clock: the seed writes will not.
        start = max(first, cluster_time(self.client).time, int(time.time()) + 1)
        while time.time() < start:  # a write's cluster time is at least its wall time
            time.sleep(0.1)
        return datetime.fromtimestamp(start, UTC)

    def _start_streams(self) -> None:
        for name, stream in self.streams.items():
            if name in FOLD_STREAMS:
                reset_stream(stream, self.client, self.store, to_time=None, actor="torture")
                checkpoint = self.store.checkpoint(name)
                assert checkpoint is not None and checkpoint.start_at_operation_time is not None
                self.reset_starts[name] = [pack_ts(checkpoint.start_at_operation_time)]
            else:
                drain(stream, self.raw, self.store, self.lake, resnapshot=True)
            self.log.add(f"start {name}: {'reset to now' if name in FOLD_STREAMS else 'snapshot'}")

    def _monitor(self) -> None:
        store = StateStore(self.state_url)
        while not self._stop_monitor.wait(0.075):
            for name in self.streams:
                with contextlib.suppress(TidemarkError):
                    checkpoint = store.checkpoint(name)
                    if checkpoint is not None and checkpoint.token is not None:
                        self.samples.append(
                            Sample(name, datetime.now(UTC), checkpoint.token.to_json())
                        )
        store.close()

    def _loop(self, name: str, body: Callable[[], None]) -> None:
        while not self.writers.stop.is_set():
            try:
                body()
            except Exception:
                self.stats.unexpected.append(f"{name}: {traceback.format_exc()[-800:]}")

    def _race(self) -> None:
        """Back-to-back drains of the quiet stream: some begin just before a write lands, so
        the run's first event lies past its horizon."""
        if "sparse" not in self.streams:
            self.writers.stop.wait(1)
            return
        self.stats.runs["race drain"] += 1
        with contextlib.suppress(LeaseHeld, TidemarkError):
            result = drain(self.streams["sparse"], self.raw, self.store, self.lake)
            if result.stop_reason == "horizon" and result.events == 0:
                self.stats.runs["race hit (first event past the horizon)"] += 1
                self.log.add("race drain sparse -> first event past its horizon")

    def _gc_loop(self) -> None:
        """gc keeps running, so it overlaps replays and drains in flight."""
        self.stats.runs["gc_loop"] += 1
        with contextlib.suppress(TidemarkError):
            self._gc()
        self.writers.stop.wait(self.rng.uniform(0.2, 0.6))

    def _schedule(self) -> None:
        deadline = time.monotonic() + self.cfg.write_seconds
        running: list[tuple[str, threading.Thread]] = []
        while time.monotonic() < deadline:
            running = [(k, t) for k, t in running if t.is_alive()]
            if len(running) < self.cfg.max_parallel:
                kind, name, action = self._pick()
                if kind.startswith("transform") and any(
                    k.startswith("transform") for k, _ in running
                ):
                    continue  # one Spark transform at a time: two cores are shared
                thread = threading.Thread(
                    target=self._run_op, args=(kind, name, action), daemon=True
                )
                thread.start()
                running.append((kind, thread))
            time.sleep(self.rng.uniform(0.05, 0.3))
        self.writers.join()
        for _, thread in running:
            thread.join()

    def _pick(self) -> tuple[str, str, Callable[[], str]]:
        """The next operation, from the seeded generator (its timing is the machine's)."""
        rng = self.rng
        names = list(self.streams)
        name = rng.choice(names)
        stream = self.streams[name]
        roll = rng.random()
        kill = rng.uniform(0.3, 3.0) if rng.random() < self.cfg.kill_fraction else None
        if self.cfg.history_lost and roll < 0.06:
            return "roll_oplog", "*", lambda: self._inproc(self._roll_oplog)
        if roll < 0.30:
            return (
                "drain",
                name,
                lambda: self._inproc(lambda: drain(stream, self.raw, self.store, self.lake)),
            )
        if roll < 0.42:
            return "drain_child", name, lambda: self._child("drain", stream, kill)
        if roll < 0.64:
            start, end = self._window(rng)
            if rng.random() < 0.5:
                return "replay_child", name, lambda: self._child("replay", stream, kill, start, end)
            return "replay", name, lambda: self._inproc(lambda: self._replay(stream, start, end))
        if roll < 0.67 and name not in FOLD_STREAMS:
            return "resnapshot_child", name, lambda: self._child("resnapshot", stream, kill)
        if roll < 0.80:
            return "gc", "*", lambda: self._inproc(self._gc)
        if roll < 0.86 and rng.random() < 0.5:
            # A compaction (Delta OPTIMIZE and a purge of deletion vectors, as often as a
            # transform), killed mid-way as often as a transform is.
            if self.cfg.transform_in_child:
                kill = rng.uniform(3.0, 20.0) if rng.random() < self.cfg.kill_fraction else None
                return "transform_compact_child", name, lambda: self._child("compact", stream, kill)
            return "transform_compact", name, lambda: self._inproc(lambda: self._compact(stream))
        if roll < 0.86:
            if self.cfg.transform_in_child:
                kill = rng.uniform(3.0, 20.0) if rng.random() < self.cfg.kill_fraction else None
                return "transform_child", name, lambda: self._child("transform", stream, kill)
            return "transform", name, lambda: self._inproc(lambda: self._transform(stream))
        return (
            "drain",
            name,
            lambda: self._inproc(lambda: drain(stream, self.raw, self.store, self.lake)),
        )

    def _window(self, rng: random.Random) -> tuple[datetime, datetime]:
        """A closed window in the past, often reaching before the streams' start."""
        now = int(time.time()) - 1
        first = int(self.t0.timestamp())
        start = first if rng.random() < 0.4 else rng.randint(first, max(first, now - 1))
        end = min(now, start + rng.randint(1, 30))
        return datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(max(end, start + 1), UTC)

    def _run_op(self, kind: str, name: str, action: Callable[[], str]) -> None:
        self.stats.runs[kind] += 1
        try:
            outcome = action()
        except Exception as exc:  # anything but a Tidemark message is unexpected
            outcome = f"CRASH {type(exc).__name__}: {str(exc)[:200]}"
            self.stats.unexpected.append(f"{kind} {name}: {traceback.format_exc()[-800:]}")
        if outcome == "killed":
            self.stats.kills[kind] += 1
        self.stats.outcomes[outcome.split(":")[0]] += 1
        self.log.add(f"{kind:16} {name:10} -> {outcome}")

    def _inproc(self, action: Callable[[], Any]) -> str:
        try:
            result = action()
        except LeaseHeld:
            return "lease held"
        except TidemarkError as exc:
            return self._refusal(type(exc).__name__, str(exc).splitlines()[0])
        return "ok" + (f" ({result})" if isinstance(result, str) else "")

    def _refusal(self, kind: str, message: str) -> str:
        """Refusals the interleavings make legitimate; any other error is a finding."""
        if kind in EXPECTED_ERRORS:
            return f"refused: {message[:160]}"
        self.stats.unexpected.append(f"{kind}: {message[:300]}")
        return f"ERROR {kind}: {message[:200]}"

    def _child(self, kind: str, stream: StreamConfig, kill: float | None, *window: datetime) -> str:
        args = [kind, self.uri, self.state_url, str(self.lake), stream.model_dump_json()]
        args += [w.isoformat() for w in window]
        outcome, err = run_child(args, kill, self.env)
        if outcome == "error":
            kind, _, message = err.partition(": ")
            return self._refusal(kind.rsplit(".", 1)[-1], message)
        return outcome

    def _replay(self, stream: StreamConfig, start: datetime, end: datetime) -> str:
        from jobs.capture import replay

        result = replay(stream, self.raw, self.store, self.lake, start, end)
        return f"{result.events} events, {result.stop_reason}"

    def _roll_oplog(self) -> str:
        """Hold every stream's lease (so none moves) and write until the oplog's first entry
        lies past every checkpoint: the next drain finds its history lost."""
        leases = []
        try:
            for name in self.streams:
                leases.append(self.store.acquire_lease(name, timedelta(minutes=5)))
            positions = [
                pack_ts(c.cluster_time)
                for c in (self.store.checkpoint(n) for n in self.streams)
                if c is not None and c.cluster_time is not None
            ]
            target = max(positions, default=0)
            blob = "x" * 100_000
            for _ in range(120):
                self.client[f"{self.db_a}_filler"].filler.insert_many(
                    [{"blob": blob} for _ in range(20)]
                )
                self.client.admin.command("fsync")
                window = oplog_window(self.client)
                if window is not None and pack_ts(window.first) > target:
                    return "rolled past every checkpoint"
                time.sleep(0.5)
            return "never rolled"
        finally:
            for lease in leases:
                self.store.release_lease(lease)

    def _gc(self, vacuum: bool = False) -> str:
        """A sweep of the raw zone; with `vacuum` (the final runs, when this process has a
        session: sharing it with a concurrent run's Delta writes is not what is tested), also
        Delta VACUUM of the curated tables, with no minimum age either."""
        spark = (lambda: self.spark) if vacuum and self.spark is not None else None
        sweeps = collect_garbage(self.lake, self.store, min_age_seconds=0, spark=spark)
        removed = sum(len(s.result.removed) for s in sweeps if s.result is not None)
        vacuumed = sum(len(s.curated or []) for s in sweeps)
        return f"removed {removed}" + (f", vacuumed {vacuumed}" if spark else "")

    def _compact(self, stream: StreamConfig) -> str:
        from jobs.transform import compact

        result = compact(self.spark, self.store, self.lake, stream)
        return f"compacted {result.deltas} deltas into v{result.version}"

    def _transform(self, stream: StreamConfig) -> str:
        from jobs.transform import transform

        result = transform(self.spark, self.store, self.lake, stream)
        return f"+{result.changes_added} changes, v{result.version}"

    def _settle(self) -> None:
        """One clean run of each step: drains until caught up, gc, a transform; then a late
        backfill of the time before the streams' start for a few streams, and its transform
        (an old insert folded after the newer delete that an earlier transform folded)."""
        lagging = next((n for n in ("ords_tiny", "db_a", "cluster") if n in self.streams), None)
        if lagging is not None:
            self._replay_folded_before_the_drain(lagging)
        self._settle_once(self.streams)
        late = self.rng.sample(sorted(self.streams), k=min(3, len(self.streams)))
        late += [n for n in ("ddl_go", "db_b") if n in self.streams and n not in late]
        for name in late:
            stream = self.streams[name]
            windows = [(self.t0, self.t0 + timedelta(seconds=3))]
            # And a window around the stream's first drop, rename or dropDatabase.
            ddl = [t for db, t in self.writers.ddl_times if stream.database in (None, db)]
            if ddl:
                first = datetime.fromtimestamp(int(ddl[0]), UTC)
                windows.append((first, first + timedelta(seconds=3)))
            for start, end in windows:
                outcome = self._inproc(lambda s=stream, a=start, b=end: self._replay(s, a, b))
                self.log.add(f"late backfill {name} [{start:%H:%M:%S}, {end:%H:%M:%S}): {outcome}")
        busy = next((n for n in ("db_a", "ords_tiny", "hist_db") if n in self.streams), late[0])
        self._replay_under_gc(busy)
        late += [busy] if busy not in late else []
        self._settle_once({name: self.streams[name] for name in late})

    def _replay_folded_before_the_drain(self, name: str) -> None:
        """A replay of a recent window transformed while the incremental drain lags behind
        it: the window holds a document's delete, the drain brings its older insert only
        later, and that insert must not bring the document back (tombstones)."""
        stream = self.streams[name]
        db = stream.database or self.db_a
        coll = self.client[db][stream.collection or "orders"]
        key = f"lagging-{self.cfg.seed}"

        def next_second() -> datetime:
            moment = datetime.fromtimestamp(int(time.time()) + 1, UTC)
            time.sleep(max(0.0, moment.timestamp() - time.time()) + 0.05)
            return moment

        next_second()
        coll.insert_one({"_id": key})
        deleted_at = next_second()
        coll.delete_one({"_id": key})
        end = next_second() + timedelta(seconds=1)
        time.sleep(max(0.0, end.timestamp() - time.time()) + 0.2)
        self.client[db]["elsewhere"].insert_one({})  # the stream's tokens pass the window
        outcome = self._inproc(lambda: self._replay(stream, deleted_at, end))
        self.log.add(f"lagging drain {name}: replay of the delete only: {outcome}")
        self.log.add(
            f"lagging drain {name}: transform before the drain: {self._final_transform(stream)}"
        )

    def _final_transform(self, stream: StreamConfig) -> str:
        if self.cfg.transform_in_child:
            return self._child("transform", stream, None)
        try:
            return self._inproc(lambda s=stream: self._transform(s))
        except Exception as exc:  # e.g. Spark finding a committed file gone
            return f"CRASH {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"

    def _replay_under_gc(self, name: str) -> None:
        """A long backfill in a child process while gc sweeps back to back: age must not be
        what keeps an in-flight replay's files safe (min_age_seconds=0)."""
        start = self.t0
        end = datetime.fromtimestamp(int(time.time()) - 1, UTC)
        outcome: list[str] = []
        child = threading.Thread(
            target=lambda: outcome.append(
                self._child("replay", self.streams[name], None, start, end)
            )
        )
        child.start()
        sweeps = 0
        while child.is_alive():
            self._gc()
            sweeps += 1
        child.join()
        self.log.add(
            f"replay under gc {name} [{start:%H:%M:%S}, {end:%H:%M:%S}): {outcome[0]}; "
            f"{sweeps} gc sweeps meanwhile"
        )

    def _settle_once(self, streams: dict[str, StreamConfig]) -> None:
        for name, stream in streams.items():
            try:
                self._drain_until_quiet(stream)
            except StreamInvalidated as exc:
                self.log.add(f"final drain {name}: stopped at an invalidate (on_invalidate)")
                if stream.on_invalidate != "stop":
                    self.final_errors[name] = str(exc).splitlines()[0][:300]
            except TidemarkError as exc:
                self.final_errors[name] = str(exc).splitlines()[0][:300]
                self.log.add(f"final drain {name}: {type(exc).__name__}: {self.final_errors[name]}")
        self.log.add(f"final gc: {self._inproc(lambda: self._gc(vacuum=True))}")
        for name, stream in streams.items():
            outcome = self._final_transform(stream)
            self.log.add(f"final transform {name}: {outcome}")
            if not outcome.startswith("ok"):
                self.final_errors[f"{name} transform"] = outcome

    def _drain_until_quiet(self, stream: StreamConfig) -> None:
        empty = 0
        for _ in range(5000):
            result = drain(stream, self.raw, self.store, self.lake)
            if result.stop_reason == "caught_up":
                return
            empty = empty + 1 if result.events == 0 else 0
            if empty >= 3:  # a stream that no longer moves: the oracle shows what it missed
                self.log.add(f"final drain {stream.name}: stuck ({result.stop_reason})")
                return
        raise AssertionError(f"stream {stream.name} never caught up")


# -- the reference: plain watch() ------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """One reference event, reduced to what the oracle compares."""

    data: str
    op: str
    ts: int  # packed cluster time
    db: str | None
    coll: str | None
    key: str | None  # canonical Extended JSON of the document key, like `_tm_key`
    doc: str | None  # canonical Extended JSON of fullDocument
    to: tuple[str, str] | None


def _ref(event: Any) -> Ref:
    ns, to = event.get("ns") or {}, event.get("to")
    key, doc = event.get("documentKey"), event.get("fullDocument")
    return Ref(
        data=event["_id"]["_data"],
        op=event["operationType"],
        ts=pack_ts(event["clusterTime"]),
        db=ns.get("db"),
        coll=ns.get("coll"),
        key=canonical(key.raw) if key is not None else None,
        doc=canonical(doc.raw) if doc is not None else None,
        to=(to["db"], to["coll"]) if to is not None else None,
    )


def reference_events(raw: MongoClient, stream: StreamConfig, start: int) -> list[Ref]:
    """Every event of the stream's scope from `start` on, as plain `watch()` returns them,
    going on after each invalidate with startAfter; the stream's `$match` is applied here."""
    target: Any = raw
    if stream.database is not None:
        target = raw[stream.database]
        if stream.collection is not None:
            target = target[stream.collection]
    events: list[Ref] = []
    options: dict[str, Any] = {"start_at_operation_time": unpack_ts(start)}
    while True:
        with target.watch(full_document="updateLookup", max_await_time_ms=300, **options) as cs:
            last = None
            while cs.alive:
                event = cs.try_next()
                if event is None:
                    break
                last = event
                events.append(_ref(event))
            if last is None or last["operationType"] != "invalidate":
                return [e for e in events if matches(stream, e)]
            options = {"start_after": last["_id"]}


def matches(stream: StreamConfig, event: Ref) -> bool:
    """The stream's `$match` stages (the two forms the variants use), in Python, with
    Tidemark's rule: deletes and namespace events pass a non-namespace filter while the
    stream feeds `current` (`tidemark.pipeline_stages.capture_pipeline`)."""
    passes_filters = stream.current_table and event.op in ALWAYS_PASSING_EVENTS
    for stage in stream.pipeline:
        spec = stage.get("$match", {})
        hidden = "operationType" in spec and event.op not in spec["operationType"]["$in"]
        if hidden and not passes_filters:
            return False
        if "ns.db" in spec and event.db not in spec["ns.db"]["$in"]:
            return False
    return True


def covers(token: str, event: Ref) -> bool:
    """Whether a stored resume token says `event` is consumed."""
    data = token_from_json(token)["_data"]
    if is_high_water_mark(data):  # a high-water mark: its time is covered
        until = covered_until(data)
        return until is not None and event.ts < pack_ts(until)
    return event.data <= data


# -- the oracle ------------------------------------------------------------------------------

CHECKS = ("current", "changes", "replays", "files", "tokens")


@dataclass
class Verdict:
    stream: str
    check: str
    ok: bool
    detail: str = ""


@dataclass
class Segment:
    start: int  # packed startAtOperationTime of the explicit move that began it
    moved_at: datetime  # when the move was committed (before it: the previous segment)
    end: str | None = None  # the token before the next move (or the final one)


def segments(store: StateStore, name: str, plain_starts: list[int]) -> list[Segment]:
    """Incremental coverage: from each explicit move (resets, snapshots) to the next.

    A snapshot's move starts at the snapshot's time; a reset records only its description,
    so `plain_starts` gives the targets of the plain resets, in order."""
    plain = iter(plain_starts)
    snapshot_times = {s.id: pack_ts(s.cluster_time) for s in store.snapshots(name)}
    found: list[Segment] = []
    for reset in store.resets(name):
        if found:
            found[-1].end = reset["from_token"]
        match = re.match(r"snapshot (\S+)", reset["to_description"])
        start = snapshot_times[match.group(1)] if match else next(plain)
        found.append(Segment(start, reset["at"].replace(tzinfo=UTC)))
    checkpoint = store.checkpoint(name)
    if found and checkpoint is not None:
        found[-1].end = checkpoint.token.to_json() if checkpoint.token else None
    return found


def batch_events(lake: LakePath, batch: Any) -> list[str] | None:
    """The event ids a committed batch lists; None if one of its files is gone."""
    ids: list[str] = []
    for entry in batch.files:
        path = lake / entry.path
        if not path.exists():
            return None
        ids += read_parquet(path, columns=["event_id"]).column("event_id").to_pylist()
    return ids


class Oracle:
    def __init__(self, torture: Torture) -> None:
        self.t = torture
        self.verdicts: list[Verdict] = []
        self.captured: dict[str, int] = {}

    def check_all(self) -> list[Verdict]:
        t = self.t
        for name, stream in t.streams.items():
            segs = self._segments(name)
            batches = t.store.batches(name)
            replays = [b for b in batches if b.source == "replay" and b.window_start is not None]
            starts = [s.start for s in segs] + [pack_ts(b.window_start) for b in replays]
            refs, lost = self._reference(stream, starts, segs)
            if lost:  # the tiny oplog rolled past: only what it still holds is checked
                segs = [s for s in segs if s.start >= lost]
                replays = [b for b in replays if pack_ts(b.window_start) >= lost]
            expected = self._expected(stream, refs, segs, replays)
            self._check_current(name, stream, refs, expected)
            self._check_changes(name, refs, expected, lost)
            self._check_replays(name, stream, refs, replays)
            self._check_files(name, batches)
            self._check_tokens(name, refs, segs, batches)
        return self.verdicts

    def _reference(
        self, stream: StreamConfig, starts: list[int], segs: list[Segment]
    ) -> tuple[list[Ref], int]:
        """The reference events, and the start they are complete from when the oplog lost
        the earlier ones (0: complete)."""
        if not starts:
            return [], 0
        try:
            return reference_events(self.t.raw, stream, min(starts)), 0
        except PyMongoError as exc:
            if getattr(exc, "code", None) not in (280, 286) or not segs:
                raise
            return reference_events(self.t.raw, stream, segs[-1].start), segs[-1].start

    def _segments(self, name: str) -> list[Segment]:
        return segments(self.t.store, name, self.t.reset_starts.get(name, []))

    def _expected(
        self, stream: StreamConfig, refs: list[Ref], segs: list[Segment], replays: list[Any]
    ) -> list[Ref]:
        """The reference events the lake must hold: segment coverage plus replay windows."""
        chosen: dict[str, Ref] = {}
        for seg in segs:
            if seg.end is None:
                continue
            for e in refs:
                if e.ts >= seg.start and covers(seg.end, e):
                    chosen[e.data] = e
        if segs:  # the clean final run must have caught up: the last segment reaches the end
            for e in refs:
                if e.ts >= segs[-1].start:
                    chosen[e.data] = e
                    if e.op == "invalidate" and stream.on_invalidate == "stop":
                        break
        for batch in replays:
            for e in refs:
                if pack_ts(batch.window_start) <= e.ts < pack_ts(batch.window_end):
                    chosen[e.data] = e
                    if e.op == "invalidate" and stream.on_invalidate == "stop":
                        break
        return sorted(chosen.values(), key=lambda e: e.data)

    def _add(self, name: str, check: str, problems: list[str], note: str = "") -> None:
        detail = "; ".join(problems[:6]) + (
            f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
        )
        self.verdicts.append(Verdict(name, check, not problems, detail or note))

    # 1. current
    def _check_current(
        self, name: str, stream: StreamConfig, refs: list[Ref], expected: list[Ref]
    ) -> None:
        t = self.t
        # Each collection's `current` as any Delta reader sees it (`deltalake`, no Tidemark
        # code): its rows are the live documents, with no rule to apply.
        got: dict[tuple[str, str, str], str] = {}
        problems = []
        for (db, coll), path in current_tables(t.store, t.lake, name).items():
            rows = query(path, "SELECT _tm_key, _tm_document FROM t")
            for r in rows:
                key = (db, coll, r["_tm_key"])
                if key in got:
                    problems.append(f"key twice in {path}: {key}")
                got[key] = r["_tm_document"]
        if name in FOLD_STREAMS:
            want, unsure = python_fold(expected, stream.database, stream.collection)
            note = (
                "compared with a Python fold of the reference events (DDL hidden or stopped); "
                f"{len(unsure)} keys last set by an update lookup not compared"
            )
        else:
            want, unsure = self._source(stream), set()
            note = "compared with find()"
        for key in sorted(set(got) | set(want), key=str):
            if key in unsure:
                continue
            if got.get(key) != want.get(key):
                problems.append(
                    f"{key}: current={_short(got.get(key))} expected={_short(want.get(key))}"
                )
        self._add(name, "current", problems, note)

    def _source(self, stream: StreamConfig) -> dict[tuple[str, str, str], str]:
        raw = self.t.raw
        if stream.collection is not None:
            # A collection renamed away leaves a collection stream's scope: its documents
            # leave `current` (README, "The tables"), so only the watched name is compared.
            names = [(stream.database, stream.collection)]
        else:
            dbs = [stream.database] if stream.database else [self.t.db_a, self.t.db_b]
            names = [
                (db, c)
                for db in dbs
                for c in raw[db].list_collection_names()
                if not c.startswith("system.")
            ]
        state = {}
        for db, coll in names:
            for doc in raw[db][coll].find():
                key = canonical(bson.encode({"_id": bson.decode(doc.raw)["_id"]}))
                state[(db, coll, key)] = canonical(doc.raw)
        return state

    # 2. changes
    def _check_changes(self, name: str, refs: list[Ref], expected: list[Ref], lost: int) -> None:
        rows = [
            row
            for table in TransformState(self.t.store).tables(name)
            if table.kind == "changes"
            for row in query(self.t.lake / table.path, "SELECT event_id, operation_type FROM t")
        ]
        logged = [r["event_id"] for r in rows if r["operation_type"] not in SNAPSHOT_OPS]
        self.captured[name] = len(logged)
        counts = Counter(logged)
        want = {e.data: e for e in expected}
        all_refs = {e.data: e for e in refs}
        problems = [f"twice: {i}" for i, n in counts.items() if n > 1]
        missing = [e for d, e in want.items() if d not in counts]
        problems += [
            f"missing {e.op} {e.db}.{e.coll} {e.key} at {unpack_ts(e.ts)} ({e.data[:40]}..)"
            for e in missing
        ]
        # Events older than the oplog's history cannot be judged: only what it still holds is.
        extra = [d for d in counts if d not in want and (not lost or d in all_refs)]
        problems += [
            f"extra {all_refs[d].op if d in all_refs else '(not in the reference)'} {d[:40]}.."
            for d in extra
        ]
        self._add(name, "changes", problems, f"{len(want)} expected events, {len(logged)} logged")

    # 2b. each replay batch holds its whole window (the union above hides a partial window
    # whose events the incremental segments also hold)
    def _check_replays(
        self, name: str, stream: StreamConfig, refs: list[Ref], replays: list[Any]
    ) -> None:
        problems = []
        for batch in replays:
            held = batch_events(self.t.lake, batch)
            if held is None:
                continue  # its files are gone: the files check says so
            want = []
            for e in refs:
                if pack_ts(batch.window_start) <= e.ts < pack_ts(batch.window_end):
                    want.append(e)
                    if e.op == "invalidate" and stream.on_invalidate == "stop":
                        break
            lacking = [e for e in want if e.data not in set(held)]
            if lacking:
                first = lacking[0]
                problems.append(
                    f"replay batch {batch.id} window [{batch.window_start}, "
                    f"{batch.window_end}) holds {len(held)} of {len(want)} events; "
                    f"first missing: {first.op} {first.db}.{first.coll} at {unpack_ts(first.ts)}"
                    f" (last held op: {batch.events_by_type})"
                )
        self._add(name, "replays", problems, f"{len(replays)} replay batches")

    # 3. files
    def _check_files(self, name: str, batches: list[Any]) -> None:
        problems = [
            f"batch {b.id} ({b.source}) lists missing {f.path}"
            for b in batches
            for f in b.files
            if not (self.t.lake / f.path).exists()
        ]
        self._add(name, "files", problems, f"{sum(len(b.files) for b in batches)} files")

    # 4. tokens
    def _check_tokens(
        self, name: str, refs: list[Ref], segs: list[Segment], batches: list[Any]
    ) -> None:
        committed: dict[str, datetime] = {}
        for b in batches:
            if b.source != "incremental":
                continue
            ids = batch_events(self.t.lake, b) or []
            at = b.committed_at.replace(tzinfo=UTC)
            for i in ids:
                committed[i] = min(committed.get(i, at), at)
        samples = [s for s in self.t.samples if s.stream == name]
        samples += [
            Sample(name, b.committed_at.replace(tzinfo=UTC), b.token_after.to_json())
            for b in batches
            if b.source == "incremental" and b.token_after
        ]
        first_seen: dict[str, datetime] = {}
        for s in samples:
            first_seen[s.token] = min(first_seen.get(s.token, s.at), s.at)
        problems = []
        for token, at in sorted(first_seen.items(), key=lambda x: x[1]):
            live = [seg for seg in segs if seg.moved_at < at]
            if not live:
                continue
            start = live[-1].start
            for e in refs:
                if e.ts < start:
                    continue
                if not covers(token, e):
                    break
                when = committed.get(e.data)
                if when is None or when > at:
                    problems.append(
                        f"token {token_from_json(token)['_data'][:26]}.. (seen {at:%H:%M:%S.%f}) "
                        f"covers {e.op} {e.db}.{e.coll} {e.key} at {unpack_ts(e.ts)} "
                        + (
                            "never committed"
                            if when is None
                            else f"committed at {when:%H:%M:%S.%f}"
                        )
                    )
                    break
        self._add(name, "tokens", problems, f"{len(first_seen)} distinct tokens sampled")


def python_fold(
    events: list[Ref], database: str | None, collection: str | None
) -> tuple[dict[tuple[str, str, str], str], set[tuple[str, str, str]]]:
    """The reference fold, in event order. Keys whose last event is an update carry a post-image
    looked up at read time (updateLookup), not the drain's: they are not compared ('unsure')."""
    state: dict[tuple[str, str, str], str] = {}
    unsure: set[tuple[str, str, str]] = set()
    for e in sorted(events, key=lambda e: e.data):
        if e.op in ("insert", "replace", "update") and e.key is not None:
            key = (e.db, e.coll, e.key)
            if e.doc is not None:
                state[key] = e.doc
            if e.op == "update":
                unsure.add(key)
            else:
                unsure.discard(key)
        elif e.op == "delete" and e.key is not None:
            state.pop((e.db, e.coll, e.key), None)
            unsure.discard((e.db, e.coll, e.key))
        elif e.op == "drop":
            state = {k: v for k, v in state.items() if (k[0], k[1]) != (e.db, e.coll)}
        elif e.op == "dropDatabase":
            state = {k: v for k, v in state.items() if k[0] != e.db}
        elif e.op == "rename" and e.to is not None:
            # The target's old documents go; the source's move only if the stream watches the
            # target, else they leave `current` as with a drop (README, "The tables").
            inside = database is None or (e.to[0] == database and collection in (None, e.to[1]))
            moved = {}
            for k, v in state.items():
                if (k[0], k[1]) == e.to:
                    continue
                if (k[0], k[1]) == (e.db, e.coll):
                    if inside:
                        moved[(*e.to, k[2])] = v
                    continue
                moved[k] = v
            state = moved
            unsure = {
                (*e.to, k[2]) if (k[0], k[1]) == (e.db, e.coll) else k
                for k in unsure
                if inside or (k[0], k[1]) != (e.db, e.coll)
            }
    return state, unsure


def _short(value: str | None) -> str:
    if value is None:
        return "absent"
    return value if len(value) < 90 else value[:87] + "..."


# -- the report ------------------------------------------------------------------------------


def report(
    torture: Torture, verdicts: list[Verdict], captured: dict[str, int], seconds: float
) -> str:
    """The seed, the table of runs and checks, and for failures the details and the step log."""
    t, s = torture, torture.stats
    lines = [
        f"torture seed {t.cfg.seed}: {seconds:.0f} s, databases {t.db_a} / {t.db_b}",
        "runs:  " + ", ".join(f"{k} {v}" for k, v in sorted(s.runs.items())),
        "kills: " + (", ".join(f"{k} {v}" for k, v in sorted(s.kills.items())) or "none"),
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items())),
        "writes: " + ", ".join(f"{k} {v}" for k, v in sorted(t.writers.writes.items())),
        "snapshots: " + ", ".join(f"{k} {v}" for k, v in sorted(snapshot_reasons(t).items())),
        "",
        f"{'stream':10} {'captured':>8}  " + "  ".join(f"{c:8}" for c in CHECKS),
    ]
    by = {(v.stream, v.check): v for v in verdicts}
    for name in t.streams:
        cells = [("ok" if by[(name, c)].ok else "FAIL") if (name, c) in by else "-" for c in CHECKS]
        lines.append(f"{name:10} {captured.get(name, 0):>8}  " + "  ".join(f"{c:8}" for c in cells))
    failed = [v for v in verdicts if not v.ok]
    if t.final_errors:
        lines += ["", "errors of the final clean runs:"]
        lines += [f"  {k}: {v}" for k, v in t.final_errors.items()]
    if s.unexpected or t.writers.errors:
        lines += ["", "unexpected exceptions:"] + [
            f"  {u}" for u in s.unexpected[:5] + t.writers.errors
        ]
    if failed:
        lines += ["", "failures:"] + [f"  {v.stream}/{v.check}: {v.detail}" for v in failed]
        lines += ["", f"step log (seed {t.cfg.seed}):", t.log.tail(400)]
    return "\n".join(lines)


def snapshot_reasons(torture: Torture) -> Counter[str]:
    return Counter(s.reason for name in torture.streams for s in torture.store.snapshots(name))


def run_torture(
    uri: str, lake: LakePath, state_url: str, cfg: TortureConfig, spark: Any = None
) -> tuple[bool, str, Torture]:
    """Run, check, report: (every check passed, the report, the run)."""
    clock = time.monotonic()
    torture = Torture(uri, lake, state_url, cfg, spark)
    try:
        torture.run()
        oracle = Oracle(torture)
        verdicts = oracle.check_all()
        ok = all(v.ok for v in verdicts) and not torture.final_errors
        ok = ok and not torture.stats.unexpected
        return ok, report(torture, verdicts, oracle.captured, time.monotonic() - clock), torture
    finally:
        torture.writers.stop.set()


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child_main(sys.argv[2:])
