"""A checkpoint belongs to the deployment it was drained from (issue 23, item 2).

Two real replica sets, both named `rs0` as most are: a stream drained from set A and then
pointed at set B must refuse with nothing committed, and pointed back at A it loses nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import bson
import pytest
from pymongo import MongoClient
from sqlalchemy import create_engine, text

from jobs.capture import drain, replay
from jobs.ops.reset import reset_stream
from resources.mongo import source_identity
from state import StateStore
from state.checkpoints import compare_and_set
from state.engine import normalize_url
from state.records import NewPosition
from tests.helpers.lake_reading import committed_table
from tidemark.config import StreamConfig
from tidemark.errors import SourceChanged
from tidemark.tokens import ResumeToken, SourceIdentity


def _state(store: StateStore, stream: str) -> tuple:
    """Everything a refused run must leave as it was: the checkpoint and the manifest."""
    checkpoint = store.checkpoint(stream)
    assert checkpoint is not None
    batches = [(b.id, [f.path for f in b.files]) for b in store.batches(stream)]
    return checkpoint.token, checkpoint.version, batches, store.committed_paths(stream)


def _inserted_ids(store: StateStore, lake: Path, stream: str) -> list:
    table = committed_table(store, lake, stream)
    return [
        bson.decode(row["raw"])["documentKey"]["_id"]
        for row in table.to_pylist()
        if row["operation_type"] == "insert"
    ]


def test_other_replica_set_is_refused_and_switching_back_loses_nothing(
    make_stream, raw_client, raw_client_b, client, mongod_b, sqlite_store, lake, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)  # the first position, on A
    client[db_name]["orders"].insert_one({"_id": 1, "on": "A"})
    drain(stream, raw_client, sqlite_store, lake)
    # A write elsewhere on A: the stream's token becomes a high-water mark past it, the kind of
    # token a quiet stream holds most of the time, which B accepts without a word (an event's
    # own token B would fail to find, and call history lost).
    client[db_name]["elsewhere"].insert_one({"x": 1})
    drain(stream, raw_client, sqlite_store, lake)
    # Made on A just before the switch: the run on B must not cover it.
    client[db_name]["orders"].insert_one({"_id": 2, "on": "A"})
    with MongoClient(mongod_b.uri) as b:
        b[db_name]["orders"].insert_one({"_id": 1, "on": "B, a foreign document"})
    before = _state(sqlite_store, stream.name)

    with pytest.raises(SourceChanged) as refused:
        drain(stream, raw_client_b, sqlite_store, lake)

    message = str(refused.value)
    assert "'rs0'" in message and "replicaSetId" in message
    assert f"tidemark reset {stream.name} --to-now" in message
    assert f"tidemark resnapshot {stream.name}" in message
    assert _state(sqlite_store, stream.name) == before  # no token, no batch, no file listed

    result = drain(stream, raw_client, sqlite_store, lake)  # back on A
    assert result.events == 1
    assert _inserted_ids(sqlite_store, lake, stream.name) == [1, 2]
    on = [
        bson.decode(row["raw"])["fullDocument"]["on"]
        for row in committed_table(sqlite_store, lake, stream.name).to_pylist()
    ]
    assert on == ["A", "A"]


def test_reset_or_resnapshot_moves_the_stream_to_the_other_set_on_purpose(
    make_stream, raw_client, raw_client_b, client, mongod_b, sqlite_store, lake, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    a, b = source_identity(raw_client), source_identity(raw_client_b)
    assert sqlite_store.checkpoint(stream.name).source == a
    with pytest.raises(SourceChanged):
        drain(stream, raw_client_b, sqlite_store, lake)

    reset_stream(stream, raw_client_b, sqlite_store, to_time=None, actor="test")
    assert sqlite_store.checkpoint(stream.name).source == b
    with MongoClient(mongod_b.uri) as other:
        other[db_name]["orders"].insert_one({"_id": "on B"})
    assert drain(stream, raw_client_b, sqlite_store, lake).events == 1

    # And back to A by a resnapshot: A's collection copied afresh, the position on A.
    client[db_name]["orders"].insert_one({"_id": "on A"})
    with pytest.raises(SourceChanged):
        drain(stream, raw_client, sqlite_store, lake)
    result = drain(stream, raw_client, sqlite_store, lake, resnapshot=True)
    assert result.stop_reason == "caught_up"
    assert sqlite_store.checkpoint(stream.name).source == a
    snapshot_batches = sqlite_store.batches(stream.name, "snapshot")
    assert sum(batch.event_count for batch in snapshot_batches) >= 1
    assert sqlite_store.resets(stream.name)[-1]["to_description"].endswith(
        "(resnapshot requested on another deployment)"
    )


def test_replay_on_the_other_set_is_refused(
    make_stream, raw_client, raw_client_b, sqlite_store, lake
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    first = raw_client_b.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
    start = datetime.fromtimestamp(first.time + 1, UTC)
    before = sqlite_store.batches(stream.name)
    with pytest.raises(SourceChanged):
        replay(stream, raw_client_b, sqlite_store, lake, start, start + timedelta(seconds=1))
    assert sqlite_store.batches(stream.name) == before


def _downgrade_to_version_3(url: str) -> None:
    """The store as Tidemark wrote it before checkpoints named their deployment."""
    engine = create_engine(normalize_url(url))
    with engine.begin() as conn:
        for column in ("source_kind", "source_set", "source_id"):
            conn.execute(text(f"ALTER TABLE tidemark_checkpoints DROP COLUMN {column}"))
        # Version 6's column too (the oplog's reach at the last drain): a version-3 store
        # has neither, and its migration adds both.
        conn.execute(text("ALTER TABLE tidemark_streams DROP COLUMN oplog_first"))
        conn.execute(text("DELETE FROM tidemark_schema_version"))
        conn.execute(text("INSERT INTO tidemark_schema_version VALUES (3, CURRENT_TIMESTAMP)"))
    engine.dispose()


def test_a_store_from_before_adopts_the_first_source_it_sees(
    make_stream, raw_client, raw_client_b, client, state_url, lake, db_name
):
    stream = make_stream()
    old = StateStore(state_url)
    drain(stream, raw_client, old, lake)
    old.close()
    _downgrade_to_version_3(state_url)

    store = StateStore(state_url)  # brought up to this schema, its checkpoint kept
    try:
        checkpoint = store.checkpoint(stream.name)
        assert checkpoint is not None and checkpoint.has_position and checkpoint.source is None
        client[db_name]["orders"].insert_one({"_id": "after the upgrade"})
        assert drain(stream, raw_client, store, lake).events == 1
        assert store.checkpoint(stream.name).source == source_identity(raw_client)
        with pytest.raises(SourceChanged):
            drain(stream, raw_client_b, store, lake)
    finally:
        store.close()


def test_identity_readable_with_the_readme_role(auth_mongod):
    """The README's capture role (with `find` on local.system.replset) reads the id; without
    that line only the set name, which is then all that is compared."""
    server, uri = auth_mongod
    with MongoClient(
        f"127.0.0.1:{server.port}", directConnection=True, username="root", password="rootpw"
    ) as root:
        expected = str(root.admin.command("replSetGetConfig")["config"]["settings"]["replicaSetId"])
        if "tidemarkReplset" not in {r["role"] for r in root.admin.command("rolesInfo")["roles"]}:
            root.admin.command(
                "createRole",
                "tidemarkReplset",
                privileges=[
                    {
                        "resource": {"db": "local", "collection": "system.replset"},
                        "actions": ["find"],
                    }
                ],
                roles=[],
            )
    with MongoClient(uri) as capture:
        assert source_identity(capture) == SourceIdentity("replica_set", "rs0", None)
    with MongoClient(
        f"127.0.0.1:{server.port}", directConnection=True, username="root", password="rootpw"
    ) as root:
        root.admin.command("grantRolesToUser", "capture", roles=["tidemarkReplset"])
    try:
        with MongoClient(uri) as capture:
            assert source_identity(capture) == SourceIdentity("replica_set", "rs0", expected)
    finally:
        with MongoClient(
            f"127.0.0.1:{server.port}", directConnection=True, username="root", password="rootpw"
        ) as root:
            root.admin.command("revokeRolesFromUser", "capture", roles=["tidemarkReplset"])


A = SourceIdentity("replica_set", "rs0", "6b0525d46d8f3c7f108f541c")


@pytest.mark.fast
@pytest.mark.parametrize(
    ("current", "differs"),
    [
        (A, False),
        (SourceIdentity("replica_set", "rs0", None), False),  # id unreadable: name only
        (SourceIdentity("replica_set", "rs0", "7a0525d46d8f3c7f108f541c"), True),
        (SourceIdentity("replica_set", "rs1", None), True),
        (SourceIdentity("sharded", None, "6b0525d46d8f3c7f108f541c"), True),
    ],
)
def test_what_counts_as_another_deployment(current: SourceIdentity, differs: bool):
    assert A.differs_from(current) is differs


@pytest.mark.fast
def test_a_stored_identity_without_id_is_completed():
    stored = SourceIdentity("replica_set", "rs0", None)
    assert stored.completed_by(A) == A
    assert A.completed_by(stored) == A


@pytest.mark.fast
def test_checkpoint_store_adopts_then_refuses(state_url_sqlite: str):
    stream = StreamConfig.model_validate({"name": "s", "database": "d", "collection": "c"})
    store = StateStore(state_url_sqlite)
    try:
        assert store.ensure_stream(stream, A).source == A  # a new stream adopts
        other = SourceIdentity("replica_set", "rs0", "7a0525d46d8f3c7f108f541c")
        assert store.ensure_stream(stream, other).source == other  # no position yet: taken
        version = store.checkpoint("s").version
        with store.transaction("test") as conn:  # a first position, as a drain commits it
            compare_and_set(conn, "s", version, NewPosition(token=ResumeToken.from_json("{}")))
        with pytest.raises(SourceChanged, match="replicaSetId 7a05"):
            store.ensure_stream(stream, A)
        assert store.ensure_stream(stream, A, new_source_ok=True).source == other
    finally:
        store.close()
