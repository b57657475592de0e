"""The streams file: every mistake is one ConfigError naming the field and the fix."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from tidemark.config import StreamConfig, load_config
from tidemark.errors import ConfigError, UnknownStream

pytestmark = pytest.mark.fast

GOOD = """
streams:
  - name: orders
    database: shop
    collection: orders
    pipeline:
      - $match: {operationType: {$in: [insert, update]}}
    start: 2026-11-01T00:00:00
"""


def _load(tmp_path: Path, text: str):
    path = tmp_path / "streams.yaml"
    path.write_text(text)
    return load_config(path)


def test_a_good_file_loads(tmp_path):
    config = _load(tmp_path, GOOD)
    stream = config.stream("orders")
    assert stream.scope == "collection" and stream.namespace == "shop.orders"
    assert stream.start == datetime(2026, 11, 1, tzinfo=UTC)
    with pytest.raises(UnknownStream, match="Use one of: orders"):
        config.stream("nope")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("streams: [\n  - name: a\n    database: [unclosed\n", "not valid YAML at line"),
        ("- just a list\n", "must be a mapping with a 'streams' list"),
        (
            "streams:\n  - name: orders\n    colection: x\n",
            "streams[0] (orders).colection: unknown key",
        ),
        ("streams:\n  - name: Bad-Name\n", "stream names are slugs"),
        ("streams:\n  - name: a\n    collection: c\n", "'collection' is set but 'database' is not"),
        ("streams:\n  - name: a\n  - name: a\n", "'a' is used twice"),
        ("streams:\n  - name: a\n    pipeline: [{$project: {_id: 0}}]\n", "it excludes _id"),
        ("streams:\n  - name: a\n    pipeline: [{$unset: [_id]}]\n", "it removes _id"),
        (
            "streams:\n  - name: a\n    pipeline: [{$replaceRoot: {newRoot: $fullDocument}}]\n",
            "replaces the event and its _id",
        ),
        (
            "streams:\n  - name: a\n    pipeline: [{$group: {_id: 1}}]\n",
            "cannot follow $changeStream",
        ),
        ("streams:\n  - name: a\n    batch_size: 0\n", "batch_size"),
        ("streams:\n  - name: a\n    full_document: always\n", "full_document"),
        ("streams: []\n", "streams"),
        (
            "streams:\n  - {name: a, database: d, collection: ../../etc}\n",
            "not a valid MongoDB collection name: it may not start or end with '.'",
        ),
        ("streams:\n  - {name: a, database: d, collection: a..b}\n", "contain '..'"),
        ("streams:\n  - {name: a, database: 'my/db'}\n", "not a valid MongoDB database name"),
        ("streams:\n  - {name: a, database: d, collection: system.users}\n", "MongoDB's own"),
        ("streams:\n  - name: a\n    full_document: default\n", "needs the document after each"),
        ("streams:\n  - name: a\n    schedule: every five minutes\n", "is not a cron expression"),
        (
            "streams:\n  - name: a\n    replay: {cron: hourly}\n",
            "replay.cron: 'hourly' is not a cron",
        ),
    ],
)
def test_mistakes_are_named(tmp_path, text, expected):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, text)
    assert expected in str(error.value)
    assert "TIDEMARK_CONFIG" in str(error.value) or "Fix the file" in str(error.value)


def test_missing_file_says_how_to_point_at_one(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist.*TIDEMARK_CONFIG"):
        load_config(tmp_path / "absent.yaml")


def test_fingerprint_covers_what_tokens_depend_on_and_nothing_else():
    base = StreamConfig(name="a", database="d", collection="c")
    same = StreamConfig.model_validate(base.model_dump())
    assert same.fingerprint() == base.fingerprint()
    for change in (
        {"pipeline": [{"$match": {"x": 1}}]},
        {"full_document": "default", "current_table": False},
        {"full_document_before_change": "required"},
        {"show_expanded_events": True},
        {"collection": "other"},
        {"collection": None},
    ):
        changed = StreamConfig.model_validate(base.model_dump() | change)
        assert changed.fingerprint() != base.fingerprint(), change
    # Run sizing does not invalidate tokens.
    tuned = StreamConfig.model_validate(
        base.model_dump() | {"batch_size": 5, "max_await_time_ms": 50, "budget": {"max_events": 9}}
    )
    assert tuned.fingerprint() == base.fingerprint()


def test_extended_json_in_a_pipeline_becomes_bson():
    stream = StreamConfig(
        name="a", pipeline=[{"$match": {"wallTime": {"$gte": {"$date": "2026-01-01T00:00:00Z"}}}}]
    )
    value = stream.mongo_pipeline()[0]["$match"]["wallTime"]["$gte"]
    assert isinstance(value, datetime)
    assert value.replace(tzinfo=UTC) == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stage", "field", "why"),
    [
        ("{$project: {clusterTime: 0}}", "clusterTime", "partitioned and ordered"),
        ("{$project: {'clusterTime.t': 0}}", "clusterTime", "partitioned and ordered"),
        ("{$unset: [ns]}", "ns", "namespace"),
        ("{$unset: ns.coll}", "ns", "namespace"),
        ("{$unset: [wallTime, documentKey]}", "documentKey", "key"),
        ("{$project: {operationType: 0}}", "operationType", "what each event does"),
        ("{$project: {to: 0}}", "to", "rename"),
        ("{$set: {ns: $$REMOVE}}", "ns", "namespace"),
        ("{$project: {fullDocument: 1}}", "operationType", "what each event does"),
        ("{$project: {_id: 1}}", "clusterTime", "partitioned and ordered"),
        (
            "{$project: {operationType: 1, clusterTime: 1, ns: 1, 'documentKey._id': 1, to: 1}}",
            "documentKey",
            "key",
        ),
    ],
)
def test_a_stage_that_drops_what_the_raw_zone_or_the_fold_needs_is_named(
    tmp_path, stage, field, why
):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, f"streams:\n  - name: a\n    pipeline: [{stage}]\n")
    message = str(error.value)
    assert f"it drops {field}," in message and why in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "stage",
    [
        "{$project: {fullDocumentBeforeChange: 0, 'updateDescription.truncatedArrays': 0}}",
        "{$unset: [wallTime, lsid, txnNumber]}",
        "{$project: {operationType: 1, clusterTime: 1, ns: 1, documentKey: 1, to: 1,"
        " fullDocument: 1}}",
        "{$project: {_id: 1, operationType: true, clusterTime: 1, ns: 1, documentKey: 1, to: 1}}",
        "{$set: {note: $$REMOVE, 'fullDocument.secret': $$REMOVE}}",
    ],
)
def test_stages_that_keep_what_tidemark_needs_load(tmp_path, stage):
    config = _load(tmp_path, f"streams:\n  - name: a\n    pipeline: [{stage}]\n")
    assert config.stream("a").pipeline == [yaml.safe_load(stage)]  # kept as written


def test_when_available_post_images_are_refused_for_the_current_table(tmp_path):
    text = "streams:\n  - name: a\n    database: d\n    full_document: whenAvailable\n"
    with pytest.raises(ConfigError, match=r"streams\[0\] \(a\).*whenAvailable") as refused:
        _load(tmp_path, text)
    for fix in ("required", "updateLookup", "current_table: false"):
        assert fix in str(refused.value)
    # Without the current-state table a missing post-image loses nothing: allowed.
    change_log_only = _load(tmp_path, text + "    current_table: false\n").stream("a")
    assert change_log_only.full_document == "whenAvailable"
    assert StreamConfig(name="b", database="d", full_document="required").current_table
