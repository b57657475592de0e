"""The steady writers: seeded threads that keep changing the source while the runs go on."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bson import MaxKey, MinKey, ObjectId
from pymongo import MongoClient

from tests.helpers.oracle import burst, make_doc
from tests.helpers.torture.config import StepLog, TortureConfig

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
