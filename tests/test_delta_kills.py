"""Exactly once with Delta's own log: a transform run SIGKILLed at exact points of its Delta
commits, then run again.

A database-scope stream over three collections (a, b, c) is folded once; then each collection
is written to and drained (built once, copied per kill point), and a transform in a child
process kills itself (SIGKILL, from `tests/helpers/crash_child.py`): during the MERGE into b's
`current` (its files being written, not logged), between b's commit and c's, or after every
Delta commit and before the state store's. After the kill the state store and `read_current`
still show the previous run; the next transform repeats the run with the same number, and
then each collection's `current` (read with `deltalake`) equals `find()`, every event is in
`changes` once, and the state store records each table's newest Delta version.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs.capture import drain, drain_until_caught_up
from jobs.transform import exact_documents, transform
from state import StateStore
from tests.helpers.crash_child import data_files
from tests.helpers.delta_reading import (
    changes_event_ids,
    current_documents,
    current_tables,
    delta_version,
)
from tests.helpers.lake_reading import direct_events
from tests.helpers.oracle import current_state, source_state
from tidemark.config import StreamConfig
from tidemark.tokens import ResumeToken

ROOT = Path(__file__).resolve().parent.parent
COLLS = ("a", "b", "c")  # folded in this order: the 2nd `current` commit of a run is b's


def _seed(client, db: str) -> None:
    for coll in COLLS:
        client[db][coll].insert_many([{"_id": i, "v": i, "s": f"x{i}"} for i in range(60)])


def _writes(client, db: str, rng: random.Random) -> None:
    """Updates, deletes, re-inserts and new keys in every collection (no type change: each
    collection's fold is then one MERGE, the only commit to its `current` in the run)."""
    for coll in COLLS:
        c = client[db][coll]
        c.update_many({"_id": {"$lt": 30}}, {"$inc": {"v": 100}})
        c.delete_many({"_id": {"$gte": 50}})
        for _ in range(20):
            key = rng.randrange(80)
            c.replace_one({"_id": key}, {"_id": key, "v": -key, "s": "r"}, upsert=True)
        c.delete_one({"_id": rng.randrange(30)})


def _kill_child(point: str, mongod, state_url: str, lake: Path, stream) -> None:
    child = subprocess.run(
        [
            sys.executable, "-m", "tests.helpers.crash_child", f"kill:{point}",
            mongod.uri, state_url, str(lake), stream.model_dump_json(),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,  # a loaded machine: the child starts a JVM
    )  # fmt: skip
    assert child.returncode == -9, f"the child was not SIGKILLed: {child.stderr[-2000:]}"


def _read_all(spark, store, lake, stream: str, db: str) -> dict[str, dict[str, str]]:
    return {
        coll: current_state(exact_documents(spark, store, lake, stream, db=db, coll=coll))
        for coll in COLLS
    }


@dataclass
class Prepared:
    """A lake and state store a run has folded once, then written to and drained: the state
    each kill point starts from, built once and copied per case."""

    directory: Path
    db: str
    stream: StreamConfig
    start: ResumeToken


@pytest.fixture(scope="module")
def prepared(mongod, spark, client, raw_client, tmp_path_factory) -> Iterator[Prepared]:
    directory = tmp_path_factory.mktemp("kills")
    db = f"t_{uuid.uuid4().hex[:10]}"
    stream = StreamConfig(name="kills", database=db, max_await_time_ms=300)
    store = StateStore(f"sqlite:///{directory / 'state.db'}")
    lake = directory / "lake"
    try:
        drain(stream, raw_client, store, lake)
        start = store.checkpoint(stream.name).token
        _seed(client, db)
        drain_until_caught_up(stream, raw_client, store, lake)
        transform(spark, store, lake, stream)
        _writes(client, db, random.Random(37))
        drain_until_caught_up(stream, raw_client, store, lake)
    finally:
        store.close()
    yield Prepared(directory, db, stream, start)
    client.drop_database(db)


@pytest.mark.slow
@pytest.mark.own_servers
@pytest.mark.parametrize("point", ["during:2", "after:2", "before_commit"])
def test_a_run_killed_at_a_delta_commit_is_repeated_exactly_once(
    point, prepared, mongod, spark, raw_client, tmp_path
):
    shutil.copytree(prepared.directory, tmp_path / "case")
    state_url = f"sqlite:///{tmp_path / 'case' / 'state.db'}"
    store, lake = StateStore(state_url), tmp_path / "case" / "lake"
    stream, db_name, start = prepared.stream, prepared.db, prepared.start
    tstate = store.transforms
    latest = tstate.latest(stream.name)
    assert latest is not None
    tables = tstate.tables(stream.name)
    currents = current_tables(store, lake, stream.name)
    assert sorted(currents) == [(db_name, c) for c in COLLS]
    before = _read_all(spark, store, lake, stream.name, db_name)
    files_before = {ns: data_files(path) for ns, path in currents.items()}

    _kill_child(point, mongod, state_url, lake, stream)

    # The state store and every reader through it still see the previous run.
    assert tstate.latest(stream.name) == latest
    assert tstate.tables(stream.name) == tables
    assert _read_all(spark, store, lake, stream.name, db_name) == before
    intent = tstate.intent(stream.name)
    assert intent is not None and intent[0] == latest.run + 1
    # ... while the tables hold what the killed run committed, and only that.
    recorded = {(t.db, t.coll): t.delta_version for t in tables if t.kind == "current"}
    moved = {c: delta_version(currents[(db_name, c)]) > recorded[(db_name, c)] for c in COLLS}
    if point == "during:2":
        assert moved == {"a": True, "b": False, "c": False}
        # The kill landed inside b's MERGE: its files were being written, none was logged.
        assert data_files(currents[(db_name, "b")]) - files_before[(db_name, "b")]
    elif point == "after:2":
        assert moved == {"a": True, "b": True, "c": False}
    else:
        assert moved == {"a": True, "b": True, "c": True}

    result = transform(spark, store, lake, stream)
    assert result.run == intent[0]  # the same run, repeated
    assert tstate.intent(stream.name) is None

    for coll in COLLS:
        got = current_documents(currents[(db_name, coll)])
        assert got == source_state(raw_client, db_name, coll), coll
    reference = [e["_id"]["_data"] for e in direct_events(raw_client[db_name], start.document)]
    logged = changes_event_ids(store, lake, stream.name)
    twice = [i for i, n in Counter(logged).items() if n > 1]
    assert not twice, f"{len(twice)} events twice in `changes`"
    assert sorted(logged) == sorted(reference)
    for table in tstate.tables(stream.name):
        assert table.delta_version == delta_version(lake / table.path), table
    store.close()
