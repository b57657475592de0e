"""Every bad input a user can cause, through the CLI: exit code 2, one paragraph that names the
problem and the fix, no traceback, and the state store and lake exactly as they were."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import update

from state import StateStore, schema
from tests.helpers.cli_env import cli_environment
from tests.helpers.credentials import SECRET
from tidemark.cli.commands import main

GOOD = "streams:\n  - {name: orders, database: DB, collection: orders, max_await_time_ms: 300}\n"


@dataclass
class Case:
    name: str
    expected: str  # a fragment of the one-paragraph message
    config: str = GOOD
    uri: Callable[[dict], str] | None = None  # from the fixtures' URIs
    prepare: Callable[[dict], None] | None = None
    command: tuple[str, ...] = ("drain", "orders")


def _lake_is_a_file(env: dict) -> None:
    env["lake"] = env["lake"].parent / "lake-is-a-file"
    env["lake"].write_text("")


def _damage_token(env: dict) -> None:
    store = StateStore(env["state_url"])
    with store.engine.begin() as conn:
        conn.execute(update(schema.checkpoints).values(token="not json at all"))
    store.close()


CASES = [
    Case("malformed YAML", "is not valid YAML at line", config="streams: [\n  - {name: a\n"),
    Case(
        "unknown key",
        ".colection: unknown key",
        config="streams:\n  - {name: orders, database: d, colection: c}\n",
    ),
    Case(
        "bad slug", "stream names are slugs", config="streams:\n  - {name: Orders-1, database: d}\n"
    ),
    Case(
        "pipeline drops _id",
        "it excludes _id",
        config="streams:\n  - {name: orders, database: d, pipeline: [{$project: {_id: 0}}]}\n",
    ),
    Case(
        "pipeline drops clusterTime",
        "it drops clusterTime, which",
        config="streams:\n  - {name: orders, database: d, pipeline: "
        "[{$project: {clusterTime: 0}}]}\n",
    ),
    Case(
        "pipeline unsets ns",
        "it drops ns, which",
        config="streams:\n  - {name: orders, database: d, pipeline: [{$unset: [ns]}]}\n",
    ),
    Case(
        "pipeline keeps only some fields",
        "it drops documentKey, which",
        config="streams:\n  - {name: orders, database: d, pipeline: "
        "[{$project: {operationType: 1, clusterTime: 1, ns: 1, fullDocument: 1}}]}\n",
    ),
    Case(
        "collection name with '..'",
        "not a valid MongoDB collection name",
        config="streams:\n  - {name: orders, database: d, collection: a/../b}\n",
    ),
    Case(
        "database name with '/'",
        "not a valid MongoDB database name",
        config="streams:\n  - {name: orders, database: 'a/b'}\n",
    ),
    Case("unknown stream", "No stream named 'nope'", command=("drain", "nope")),
    Case(
        "unreachable host",
        "No MongoDB server answered",
        uri=lambda e: f"mongodb://u:{SECRET}@127.0.0.1:1/?serverSelectionTimeoutMS=500",
    ),
    Case("invalid URI", "is not valid", uri=lambda e: f"mongodb://u:{SECRET}@"),
    Case(
        "wrong credentials",
        "authentication failed",
        uri=lambda e: e["auth_uri"].replace(SECRET, "wrong"),
    ),
    Case("unwritable lake", "TIDEMARK_LAKE", prepare=_lake_is_a_file),
    Case("damaged token in the state store", "damaged resume token", prepare=_damage_token),
    Case("state store URL", "is not a database URL", prepare=lambda e: e.update(state_url="x")),
]


COMMITTED = [
    schema.checkpoints,
    schema.batches,
    schema.batch_files,
    schema.resets,
    schema.snapshots,
    schema.streams,
]


def _committed(state_url: str) -> list:
    """What a run commits (leases come and go with every attempt, so they are not in it)."""
    store = StateStore(state_url)
    with store.engine.connect() as conn:
        rows = [
            sorted(map(tuple, conn.execute(table.select()).all()), key=repr) for table in COMMITTED
        ]
    store.close()
    return rows


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if item.is_file():
            digest.update(str(item).encode() + item.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_paragraph_and_changes_nothing(
    case, mongod, auth_mongod, client, db_name, tmp_path, monkeypatch, capsys
):
    paths = cli_environment(monkeypatch, tmp_path, mongod.uri, GOOD.replace("DB", db_name))
    env = {"lake": paths["lake"], "state_url": paths["state_url"], "auth_uri": auth_mongod[1]}
    # A stream with history: a committed position and a committed batch.
    assert main(["drain", "orders"]) == 0
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(4)])
    assert main(["drain", "orders"]) == 0
    capsys.readouterr()

    if case.prepare:
        case.prepare(env)
        monkeypatch.setenv("TIDEMARK_STATE_URL", env["state_url"])
        monkeypatch.setenv("TIDEMARK_LAKE", str(env["lake"]))
    if case.config is not GOOD:
        paths["config"].write_text(case.config)
    if case.uri:
        monkeypatch.setenv("MONGODB_URI", case.uri(env))
    good_state = f"sqlite:///{tmp_path / 'state.db'}"
    state_before = _committed(good_state)
    lake_before = _fingerprint(tmp_path / "lake")

    assert main(list(case.command)) == 2
    err = capsys.readouterr().err
    assert case.expected in err, err
    assert err.startswith("tidemark: ") and err.count("\n") == 1  # one paragraph
    assert "Traceback" not in err and SECRET not in err
    assert _committed(good_state) == state_before  # nothing committed
    assert _fingerprint(tmp_path / "lake") == lake_before  # nothing written
