"""Server faults with real processes and sockets: the state store going away at commit time,
and mongod killed with -9 in the middle of a drain."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from jobs.capture import drain, drain_until_caught_up
from jobs.capture import writer as raw_writer
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.mongo import connect
from resources.processes import runs
from state import StateStore
from tests.helpers.drain_child import start_drain_child, wait_until_ready
from tests.helpers.lake_reading import committed_table
from tests.helpers.tcp_proxy import TcpProxy
from tidemark.errors import MongoConnectionError


def _through(proxy: TcpProxy, url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def test_state_store_gone_at_commit_moves_no_token_and_loses_nothing(
    mongod, client, raw_client, pg_schema_url, lake, make_stream, db_name, tmp_path
):
    target = urlsplit(pg_schema_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    url = _through(proxy, pg_schema_url)
    store = StateStore(url)
    stream = make_stream()
    drain(stream, raw_client, store, lake)
    kept = store.checkpoint(stream.name)
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(50)])

    ready = tmp_path / "ready"
    child = start_drain_child(mongod, url, lake, stream, ready)
    written = wait_until_ready(ready, child)
    proxy.cut()  # PostgreSQL goes away just before the commit
    Path(str(ready) + ".go").touch()
    _, err = child.communicate(timeout=120)
    assert child.returncode != 0
    assert "The state store at" in err and "failed during commit" in err

    proxy.restore()
    store = StateStore(url)  # a fresh pool: the old sockets are gone
    assert store.checkpoint(stream.name) == kept  # no token moved
    assert store.batch_count(stream.name) == 0
    result = drain(stream, raw_client, store, lake)  # takes over the dead run's lease
    assert result.events == 50
    rows = committed_table(store, lake, stream.name)
    assert sorted(rows.column("document_key").to_pylist()) == sorted(
        f'{{ "_id" : {{ "$numberInt" : "{i}" }} }}' for i in range(50)
    )
    assert store.committed_paths(stream.name).isdisjoint(written)
    proxy.cut()


def test_mongod_killed_mid_drain_then_the_next_run_completes(
    tmp_path, sqlite_store, make_stream, monkeypatch
):
    dbpath = tmp_path / "victim"
    server = start_mongod(dbpath)
    lake = tmp_path / "lake"
    try:
        writer = connect(server.uri)
        raw = connect(server.uri, raw=True, timeout_ms=3000)
        stream = make_stream(database="shop", collection="orders", batch_size=50)
        drain(stream, raw, sqlite_store, lake)
        kept = sqlite_store.checkpoint(stream.name)
        writer.shop.orders.insert_many([{"_id": i, "pad": "x" * 1000} for i in range(60_000)])
        writer.close()

        write = raw_writer.write_parquet_atomic
        killed: list[int] = []

        def kill_after_the_first_chunk(table, final):  # type: ignore[no-untyped-def]
            # In the drain's own thread, once its first file is in place and before it reads
            # on: a thread watching for the file lost the race to the drain's end under load.
            size = write(table, final)
            if not killed:
                os.kill(server.pid, signal.SIGKILL)
                killed.append(server.pid)
                while runs(server.pid, "mongod"):
                    time.sleep(0.01)
            return size

        monkeypatch.setattr(raw_writer, "write_parquet_atomic", kill_after_the_first_chunk)
        with pytest.raises(MongoConnectionError) as failed:
            drain(stream, raw, sqlite_store, lake)
        monkeypatch.undo()
        assert "became unreachable" in str(failed.value) and "nothing was committed" in str(
            failed.value
        )
        raw.close()
        assert sqlite_store.checkpoint(stream.name) == kept  # failed without committing
        assert sqlite_store.batch_count(stream.name) == 0
        # Restart on the same data directory and port: the next run completes.
        server = start_mongod(dbpath, port=server.port)
        raw = connect(server.uri, raw=True)
        drain_until_caught_up(stream, raw, sqlite_store, lake)
        table = committed_table(sqlite_store, lake, stream.name)
        ids = table.column("event_id").to_pylist()
        assert len(ids) == len(set(ids)) == 60_000  # each event exactly once
        raw.close()
    finally:
        stop_mongod(server)
