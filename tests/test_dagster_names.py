"""Every name MongoDB allows becomes a Dagster asset and names Dagster accepts, with no mongod
and no Spark: tables generated over the names MongoDB allows (Unicode letters, spaces,
punctuation, emoji, the longest names, names that differ only where the escaping changes
them) are recorded in a state store, and the code location's definitions are built from it
and resolved."""

from __future__ import annotations

import re
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.curated_zone import DATABASE_EVENTS
from orchestration.definitions import build_definitions
from orchestration.discovery import known_tables
from orchestration.resources import build_resources
from orchestration.table_assets import KEY_LIMIT, table_names
from state import CuratedTable, StateStore, TransformRun
from tidemark.config import TidemarkConfig, load_streams

pytestmark = pytest.mark.fast

DAGSTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")
# MongoDB's limits (6.0): a database name is under 64 bytes and holds none of /\. "$*<>:|?
# (the Windows set, the stricter); a namespace `db.coll` is at most 255 bytes; a collection
# name holds no NUL, no `$` and does not start with "system.".
DB_FORBIDDEN = '/\\. "$*<>:|?\0'
NAMESPACE_BYTES = 255
# What the escaping turns into `_`, and characters Dagster names never hold.
TRICKY = "-._ +@#/\\$'\"ключ😀é\u00a0\u200b"


def _chars(forbidden: str) -> st.SearchStrategy[str]:
    # Surrogates cannot be encoded in UTF-8, so no MongoDB name holds one.
    anything = st.characters(blacklist_categories=("Cs",), blacklist_characters=forbidden)
    return st.one_of(anything, st.sampled_from([c for c in TRICKY if c not in forbidden]))


databases = st.text(_chars(DB_FORBIDDEN), min_size=1, max_size=63).filter(
    lambda n: len(n.encode()) < 64
)
collections = st.text(_chars("\0$"), min_size=1, max_size=255).filter(
    lambda n: not n.startswith("system.")
)


def _longest(db: str, fill: str) -> str:
    """The longest collection name `db` allows, of `fill` characters."""
    room = NAMESPACE_BYTES - len(db.encode()) - 1
    return fill * (room // len(fill.encode()))


@st.composite
def tables(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """The tables of one stream: collections of a few databases, alike after escaping or the
    longest allowed, with their `$database` table (a drop) now and then."""
    dbs = draw(st.lists(databases, min_size=1, max_size=3, unique=True))
    found = set()
    for db in dbs:
        names = draw(st.lists(collections, max_size=4))
        if names and draw(st.booleans()):  # the same name with each tricky character instead
            names += [re.sub(r"[^A-Za-z0-9]", c, names[0]) for c in "-. _"]
        names += [_longest(db, f) for f in draw(st.lists(st.sampled_from("a😀ключ"), max_size=2))]
        names = [n for n in names if len(f"{db}.{n}".encode()) <= NAMESPACE_BYTES]
        if draw(st.booleans()):
            found.add((db, DATABASE_EVENTS, "changes"))
        found |= {(db, n, kind) for n in names for kind in ("changes", "current")}
    return sorted(found)


def _record(store: StateStore, stream: str, made: list[tuple[str, str, str]]) -> None:
    """The tables as a transform run's commit records them."""
    run = TransformRun(
        stream=stream,
        run=1,
        path=f"curated/{stream}",
        rows=0,
        doc_schema="",
        events_folded=len(made),
        changes_added=len(made),
        created_at=datetime.now(UTC),
        kind="merge",
        base_run=1,
    )
    records = [
        CuratedTable(stream, 1, db, coll, kind, f"curated/{stream}/{n}", 0, 0, "")
        for n, (db, coll, kind) in enumerate(made)
    ]
    lease = store.acquire_lease(stream, "transform", timedelta(minutes=5))
    try:
        store.transforms.commit(lease, stream, None, run, [], records)
    finally:
        store.release_lease(lease)


def _expected_key(stream: str, db: str, coll: str, kind: str) -> dg.AssetKey:
    return dg.AssetKey([stream, db, f"{coll}.{kind}"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(made=tables())
def test_any_tables_mongodb_allows_load_as_assets_with_valid_distinct_names(made):
    config = TidemarkConfig.model_validate({"streams": [{"name": "odd"}]})  # any database
    with tempfile.TemporaryDirectory() as home:
        state_url = f"sqlite:///{Path(home) / 'state.db'}"
        store = StateStore(state_url)
        try:
            store.ensure_stream(config.streams[0])
            _record(store, "odd", made)
        finally:
            store.close()
        resources = build_resources(
            mongodb_uri="mongodb://127.0.0.1:9/", state_url=state_url, lake_root=home
        )
        defs = build_definitions(config, resources, tables=known_tables(state_url, config.streams))
        graph = defs.resolve_asset_graph()
        keys = graph.get_all_asset_keys()
        # One `current` alone, as the UI's Materialize selects it: Dagster names an input per
        # unselected table of the step after its output.
        currents = [table_names("odd", *t).key for t in made if t[2] == "current"]
        job = defs.resolve_implicit_global_asset_job_def()
        for key in currents[:1]:
            assert job.get_subset(asset_selection={key}).nodes

    # The stream loaded (no error asset of it), with an asset per table under its real names
    # (cut short only past Dagster's storage limit), and a current's checks and lineage.
    assert dg.AssetKey(["odd", "config"]) not in keys
    named = {t: table_names("odd", *t) for t in made}
    for (db, coll, kind), names in named.items():
        assert names.key in keys
        if len(_expected_key("odd", db, coll, kind).to_db_string()) <= KEY_LIMIT:
            assert names.key == _expected_key("odd", db, coll, kind)
        assert len(names.key.to_db_string()) <= KEY_LIMIT
        if kind == "current":
            assert graph.get(names.key).parent_keys == {named[(db, coll, "changes")].key}
            checks = {c.name for c in graph.get_check_keys_for_assets({names.key})}
            assert checks == {"row_count_matches_source", "freshness", "schema_drift"}
    # Injective: no two tables share a key or a name.
    assert (
        len({n.key for n in named.values()}) == len({n.name for n in named.values()}) == len(made)
    )
    assert all(DAGSTER_NAME.match(n.name) for n in named.values())


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(databases, collections), b=st.tuples(databases, collections))
def test_two_different_tables_never_share_a_name(a, b):
    for kind_a in ("changes", "current"):
        for kind_b in ("changes", "current"):
            if (*a, kind_a) == (*b, kind_b):
                continue
            first, second = table_names("s", *a, kind_a), table_names("s", *b, kind_b)
            assert first.name != second.name and first.key != second.key
            assert DAGSTER_NAME.match(first.name) and DAGSTER_NAME.match(second.name)


@pytest.mark.parametrize(
    ("db", "coll", "plain"),
    [("shop", "orders", True), ("shop", "order_lines", True), ("shop", "a b", False),
     ("shop", "a-b", False), ("shop", "a__b", False), ("shop", DATABASE_EVENTS, False),
     ("pl", "ключ", False), ("shop_", "x", False)],
)  # fmt: skip
def test_plain_names_read_as_dagster_has_always_named_them(db, coll, plain):
    names = table_names("shop", db, coll, "current")
    assert (names.name == f"shop__{db}__{coll}_current") is plain
    assert names.key == dg.AssetKey(["shop", db, f"{coll}.current"])


def test_names_chosen_to_meet_do_not():
    """Regressions from the adversarial review: two collections a birthday search found to
    share a 40-bit hash, and a collection named like another's cut key (the old `~` mark)."""
    first, second = (table_names("odd", "d", c, "current") for c in ("c--.,~= )", "c-- ( --,"))
    assert first.name != second.name
    long = table_names("odd", "d", "😀" * 61, "changes").key
    assert long.path[2].count("$") == 1  # cut, and marked with what no collection name holds
    lookalike = long.path[2].removesuffix(".changes").replace("$", "~")
    assert table_names("odd", "d", lookalike, "changes").key != long


def test_broken_entries_get_keys_no_other_entry_has(tmp_path):
    """A broken entry named like a stream's fallback key, one with no name, and a valid stream
    named as the fallback once was: every key differs, and none is the valid stream's."""
    config = tmp_path / "streams.yaml"
    config.write_text(
        "streams:\n"
        "  - {name: stream_1, database: d, bogus: 1}\n"
        "  - {database: d}\n"
        "  - {name: stream_0, database: d}\n"
        "  - {name: a_, database: d}\n"
        "  - {name: tidemark_gc, database: d}\n"
    )
    streams_file = load_streams(config)
    keys = [b.key for b in streams_file.broken]
    assert [s.name for s in streams_file.streams] == ["stream_0"]
    assert len(set(keys)) == len(keys) == 4 and "stream_0" not in keys, keys
    messages = " ".join(str(b.error) for b in streams_file.broken)
    assert "single '_' inside" in messages and "starts with 'tidemark'" in messages


def test_a_state_store_that_is_no_database_loads_as_an_empty_one(tmp_path):
    store = tmp_path / "state.db"
    store.write_bytes(b"not a database" * 100)
    assert known_tables(f"sqlite:///{store}", []) == {}
