"""The torture run itself: starts the streams, schedules overlapping runs (in this process or in
children it kills), samples stored checkpoints, and ends with one clean run of each step."""

from __future__ import annotations

import contextlib
import os
import random
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

from jobs.capture import drain
from jobs.ops import collect_garbage, reset_stream
from resources.mongo import cluster_time, oplog_window
from state import StateStore
from tests.helpers.torture.children import REMOTE_ENV, run_child
from tests.helpers.torture.config import ROOT, StepLog, TortureConfig, stream_variants
from tests.helpers.torture.writers import Writers
from tidemark.config import StreamConfig
from tidemark.errors import LeaseHeld, StreamInvalidated, TidemarkError
from tidemark.tokens import (
    pack_ts,
)

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
        self.seconds: dict[str, float] = {}  # where the run's time went, by phase

    # -- phases ----------------------------------------------------------------------------

    def run(self) -> None:
        clock = time.monotonic()
        self.log.add(f"seed {self.cfg.seed}: databases {self.db_a}, {self.db_b}")
        self.writers.seed_edges(random.Random(f"{self.cfg.seed}-edges"))
        self.t0 = self._first_second()
        self.writers.seed(random.Random(f"{self.cfg.seed}-seed"))
        time.sleep(1.1)  # the streams start a clock second after the seed: replays go before
        self._start_streams()
        self.seconds["start"], clock = time.monotonic() - clock, time.monotonic()
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
        self.seconds["write"], clock = time.monotonic() - clock, time.monotonic()
        self._settle()
        self.seconds["settle"] = time.monotonic() - clock
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
                leases.append(self.store.acquire_lease(name, "capture", timedelta(minutes=5)))
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
        return f"compacted {result.deltas} deltas into run {result.run}"

    def _transform(self, stream: StreamConfig) -> str:
        from jobs.transform import transform

        result = transform(self.spark, self.store, self.lake, stream)
        return f"+{result.changes_added} changes, run {result.run}"

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
