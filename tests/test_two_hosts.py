"""Two Tidemark hosts against one PostgreSQL state store and one S3 lake (issue 26, item 4).

Each host is a process tree with a host name of its own (a UTS namespace: `unshare -u`, so the
leases see two machines, as two Dagster code servers or two cron hosts would be) running the
CLI over and over on the same streams while the source is written to: `tidemark drain --all` in
a loop, and a `tidemark transform --all` each: host-b's asks for a stream's transform lease
while host-a's holds it, so the hosts meet on every run. The stream's lease in the state store
is all that keeps them apart. At the end every event is in exactly one committed batch, the
change log holds each once, and each collection's `current` (read with delta-rs from S3) equals
`find()`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from state import StateStore
from state.leases import lease_name
from state.schema import utc_now
from tests.helpers.delta_reading import current_documents, current_tables, query
from tests.helpers.lake_reading import committed_table
from tests.helpers.oracle import source_state

ROOT = Path(__file__).resolve().parent.parent
HOST = r"""
import contextlib, io, json, os, socket, subprocess, sys, time
socket.sethostname(sys.argv[1])  # in its own UTS namespace: this tree's host name only
deadline, transform_at = time.time() + float(sys.argv[2]), time.time() + float(sys.argv[3])
go = sys.argv[4]  # when given: transform once this file exists (the other host holds a lease)
tidemark = os.path.join(os.path.dirname(sys.executable), "tidemark")
if go:  # imported now, so the transform asks for its lease a moment after `go` appears
    import jobs.transform
    from tidemark.cli.commands import main


def in_process():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["transform", "--all"])
    return code, out.getvalue(), err.getvalue()


runs, transformed = [], False
while time.time() < deadline or not transformed:
    if not transformed and time.time() >= transform_at:
        command, transformed = "transform", True
        while go and not os.path.exists(go):
            time.sleep(0.01)
    else:
        command = "drain"
    if go and command == "transform":
        code, out, err = in_process()
    else:
        done = subprocess.run([tidemark, command, "--all"], capture_output=True, text=True)
        code, out, err = done.returncode, done.stdout, done.stderr
    # The head of stderr names a JVM's own failure; its tail, Tidemark's paragraph.
    err = err if len(err) <= 3000 else err[:1500] + " ... " + err[-1500:]
    runs.append({"command": command, "code": code, "out": out[-1500:], "err": err})
print(json.dumps({"host": socket.gethostname(), "runs": runs}))
"""
STREAMS = """\
streams:
  - name: orders
    database: {db}
    collection: orders
  - name: items
    database: {db}
    collection: items
"""


def _host(
    name: str,
    env: dict[str, str],
    seconds: float,
    transform_after: float,
    scratch: Path,
    go: Path | None = None,
) -> dict:
    """One host: a UTS namespace for its name, and a mount namespace whose /etc/hosts resolves
    that name, as a real machine's does (a JVM looks its own host name up)."""
    hosts = scratch / f"{name}.hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {name}\n::1 localhost\n")
    bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
    host = [sys.executable, "-c", HOST, name, str(seconds), str(transform_after), str(go or "")]
    done = subprocess.run(
        ["unshare", "-u", "-m", "sh", "-c", bind, str(hosts), *host],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"host {name}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _signal_when_held(state_url: str, host: str, go: Path, holder: threading.Thread) -> None:
    """Create `go` once `host` holds the transform lease of `orders`, the first stream its
    `--all` folds: it took it just before starting its Spark session, so it keeps it for
    seconds. (Or once its loop ended, so the other host never waits forever; the test then
    finds host-b's transform was not turned away, and fails.)"""
    store = StateStore(state_url)
    try:
        while holder.is_alive():
            now = utc_now()
            if any(
                row["stream"] == lease_name("orders", "transform")
                and (row["owner"] or "").startswith(f"{host}:")
                and row["expires_at"] > now
                for row in store.lease_rows()
            ):
                break
            time.sleep(0.02)
    finally:
        store.close()
        go.touch()


@pytest.mark.slow
@pytest.mark.soak
def test_two_hosts_never_run_a_stream_at_once_and_each_event_lands_once(
    mongod, client, raw_client, db_name, pg_schema_url, s3_lake, tmp_path
) -> None:
    if subprocess.run(["unshare", "-u", "-m", "true"], capture_output=True).returncode != 0:
        pytest.fail("`unshare -u -m` is refused here: the two hosts need a namespace each")
    config = tmp_path / "streams.yaml"
    config.write_text(STREAMS.format(db=db_name))
    env = {
        **os.environ,
        "MONGODB_URI": mongod.uri,
        "TIDEMARK_CONFIG": str(config),
        "TIDEMARK_STATE_URL": pg_schema_url,
        "TIDEMARK_LAKE": str(s3_lake),
        "TIDEMARK_SPARK_MASTER": "local[1]",
        "PYTHONPATH": str(ROOT),
    }
    # The streams start now, from one host, before anything is written.
    first = subprocess.run(
        [str(Path(sys.executable).parent / "tidemark"), "drain", "--all"],
        env={**env, "TIDEMARK_HOME": str(tmp_path / "a")},
        capture_output=True,
        text=True,
    )
    assert first.returncode == 0, first.stderr

    stop = threading.Event()
    written = {"orders": 0, "items": 0}

    def write() -> None:
        n = 0
        while not stop.is_set():
            for coll in written:
                client[db_name][coll].insert_one({"_id": n, "v": n})
                if n % 3 == 0:
                    client[db_name][coll].update_one({"_id": n // 2}, {"$inc": {"v": 1}})
                written[coll] += 1
            n += 1
            time.sleep(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    results: dict[str, dict] = {}
    # host-b's transform asks for `orders` while host-a holds it (and host-a then finds `items`
    # taken), so the two meet on every run of this test, whatever the machine's load.
    go = tmp_path / "host-a-holds-a-transform-lease"
    hosts = [
        threading.Thread(
            target=lambda h=h, g=g: results.update(
                {h: _host(h, {**env, "TIDEMARK_HOME": str(tmp_path / h)}, 24, 8, tmp_path, g)}
            )
        )
        for h, g in (("host-a", None), ("host-b", go))
    ]
    for thread in hosts:
        thread.start()
    _signal_when_held(pg_schema_url, "host-a", go, hosts[0])
    for thread in hosts:
        thread.join()
    stop.set()
    writer.join()
    # One host settles: drain to the end, then fold.
    for command in ("drain", "transform"):
        done = subprocess.run(
            [str(Path(sys.executable).parent / "tidemark"), command, "--all"],
            env={**env, "TIDEMARK_HOME": str(tmp_path / "host-a")},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    assert {r["host"] for r in results.values()} == {"host-a", "host-b"}
    runs = [r for result in results.values() for r in result["runs"]]
    # Turned away by the other host's lease: a drain fails, `--all` skips that stream's transform.
    refused = [r for r in runs if r["code"] != 0 or "lease held" in r["out"]]
    print(f"runs: {len(runs)}, refused: {len(refused)}")
    # The hosts met: host-b's transform asked for `orders` while host-a held it.
    (transform_b,) = [r for r in results["host-b"]["runs"] if r["command"] == "transform"]
    assert "lease held by host-a:" in transform_b["out"], transform_b
    for host, result in results.items():
        drains = [r for r in result["runs"] if r["command"] == "drain"]
        # Each host did real work; a refusal is only ever the other host's lease.
        assert any(r["code"] == 0 for r in drains), (host, drains[:3])
        for run in result["runs"]:
            if run["code"] != 0:
                assert "lease" in (run["out"] + run["err"]).lower(), (host, run)
    store = StateStore(pg_schema_url)
    try:
        for stream in ("orders", "items"):
            ids = committed_table(store, s3_lake, stream).column("event_id").to_pylist()
            assert len(ids) == len(set(ids)), f"{stream}: an event in two committed batches"
            changes = [t for t in store.transforms.tables(stream) if t.kind == "changes"]
            logged = [
                r["event_id"]
                for t in changes
                for r in query(s3_lake / t.path, "SELECT event_id FROM t")
            ]
            assert sorted(logged) == sorted(ids), f"{stream}: the change log differs from raw"
            ((_, path),) = current_tables(store, s3_lake, stream).items()
            assert current_documents(path) == source_state(raw_client, db_name, stream)
        batches = [b.id for s in ("orders", "items") for b in store.batches(s)]
        assert len(batches) > 4  # many runs committed, from both hosts' loops
    finally:
        store.close()
