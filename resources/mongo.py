"""MongoDB connections: a checked client, cluster time and the oplog window.

`connect()` turns every way a connection goes wrong (bad URI, unreachable host, refused
credentials, a standalone server) into a `TidemarkError` whose message names the URI with its
password redacted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import (
    ConfigurationError,
    InvalidURI,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from tidemark.errors import MongoConnectionError, ReplicaSetRequired
from tidemark.tokens import SourceIdentity

_PASSWORD = re.compile(r"(mongodb(?:\+srv)?://[^:/@]+:)([^@]*)(@)")
AUTH_FAILED = 18

# Events stay raw BSON until the drain converts whole batches; tz-aware so datetimes are UTC.
RAW_CODEC = CodecOptions(document_class=RawBSONDocument, tz_aware=True)


def redact_uri(uri: str) -> str:
    """The URI with its password replaced by ***, safe for logs and error messages."""
    return _PASSWORD.sub(r"\1***\3", uri)


def connect(
    uri: str, *, timeout_ms: int = 10_000, raw: bool = False, **options: Any
) -> MongoClient:
    """A client whose server answered and is a replica set or sharded cluster."""
    shown = redact_uri(uri)
    kwargs: dict[str, Any] = {
        "appname": "tidemark",
        "tz_aware": True,
        **options,
    }
    if raw:
        kwargs["document_class"] = RawBSONDocument
    if "serverselectiontimeoutms" in uri.lower():
        timeout_ms = _uri_timeout(uri, timeout_ms)  # the URI's own setting wins
    else:
        kwargs["serverSelectionTimeoutMS"] = timeout_ms
    try:
        client: MongoClient = MongoClient(uri, **kwargs)
    except (InvalidURI, ConfigurationError, ValueError, TypeError) as exc:
        raise MongoConnectionError(
            f"The MongoDB URI {shown} is not valid: {exc}.",
            "Fix MONGODB_URI; it looks like mongodb://user:password@host1,host2/?replicaSet=rs0.",
        ) from None
    try:
        hello = client.admin.command("hello")
    except ServerSelectionTimeoutError as exc:
        client.close()
        raise MongoConnectionError(
            f"No MongoDB server answered at {shown} within {timeout_ms / 1000:.0f} s "
            f"({_first_line(exc)}).",
            "Check that the server runs and that host, port and TLS settings in MONGODB_URI "
            "are right, and that this machine may reach it.",
        ) from None
    except OperationFailure as exc:
        client.close()
        if exc.code == AUTH_FAILED:
            raise MongoConnectionError(
                f"MongoDB refused the credentials in {shown}: authentication failed.",
                "Check the user name, password and authSource in MONGODB_URI.",
            ) from None
        raise MongoConnectionError(f"MongoDB at {shown} refused 'hello': {exc}.", "") from None
    except PyMongoError as exc:
        client.close()
        raise MongoConnectionError(
            f"Connecting to MongoDB at {shown} failed: {_first_line(exc)}.",
            "Check MONGODB_URI and the server's logs.",
        ) from None
    if not hello.get("setName") and hello.get("msg") != "isdbgrid":
        client.close()
        raise ReplicaSetRequired(
            f"The MongoDB server at {shown} is a standalone mongod, and change streams need a "
            "replica set (or a sharded cluster): they read the oplog, which only a replica set "
            "keeps.",
            "Restart it with --replSet <name> and run rs.initiate() once (a one-node replica "
            "set is fine), or point MONGODB_URI at a replica set.",
        )
    return client


def _uri_timeout(uri: str, default: int) -> int:
    match = re.search(r"serverSelectionTimeoutMS=(\d+)", uri, re.IGNORECASE)
    return int(match.group(1)) if match else default


def cluster_time(client: MongoClient) -> Timestamp:
    """The deployment's current operation time: a run's horizon."""
    reply = client.admin.command("ping")
    op_time = reply.get("operationTime") or reply.get("$clusterTime", {}).get("clusterTime")
    if op_time is None:
        raise MongoConnectionError(
            "The server did not report its cluster time.",
            "Tidemark needs MongoDB 4.2 or later as a replica set or sharded cluster.",
        )
    return op_time


def source_identity(client: MongoClient) -> SourceIdentity:
    """The deployment `client` reaches, read with the least privilege that shows it.

    `hello` (no privilege) gives the replica set's name, or says mongos. The replicaSetId is
    in the set's config document, `local.system.replset`, readable with `find` on it (the
    README's capture role grants that; `clusterMonitor` does too), and through
    `replSetGetConfig` (`clusterMonitor`); behind mongos the config servers' `clusterId` is in
    `config.version` (`find` on it). Without those privileges the id is None.
    """
    hello = client.admin.command("hello")
    if hello.get("msg") == "isdbgrid":
        # Not tried against a real mongos here (none can run on this machine).
        version = _readable(lambda: client.config["version"].find_one({}, {"clusterId": 1}))
        cluster_id = version.get("clusterId") if version else None
        return SourceIdentity("sharded", None, str(cluster_id) if cluster_id else None)
    config = _readable(
        lambda: client.local["system.replset"].find_one({}, {"settings.replicaSetId": 1})
    ) or (_readable(lambda: client.admin.command("replSetGetConfig")) or {}).get("config")
    set_id = ((config or {}).get("settings") or {}).get("replicaSetId")
    return SourceIdentity("replica_set", hello.get("setName"), str(set_id) if set_id else None)


def unverified_identity(identity: SourceIdentity) -> str | None:
    """A warning when `identity` lacks its id: the guard against another deployment then
    compares names only, and most replica sets are named rs0; None when the id was read."""
    if identity.id is not None:
        return None
    if identity.kind == "sharded":
        missing, grant = "the config servers' clusterId", "`find` on config.version"
    else:
        missing, grant = "the replica set's replicaSetId", "`find` on local.system.replset"
    return (
        f"MONGODB_URI's user cannot read {missing}, so Tidemark tells deployments apart by "
        f"name only ({identity.describe()}): pointed at another of that name, this stream "
        f"would resume there without a word. Grant {grant} (the README's capture role)."
    )


def _readable(read: Any) -> Any:
    """What `read()` returns; None when the server refuses it (privileges) or lacks it."""
    try:
        return read()
    except OperationFailure:
        return None


@dataclass(frozen=True)
class OplogWindow:
    first: Timestamp
    last: Timestamp
    size_bytes: int | None = None
    max_bytes: int | None = None

    @property
    def seconds(self) -> int:
        return self.last.time - self.first.time

    @property
    def projected_seconds(self) -> float:
        """The window once the oplog is full, at the write rate seen so far: a young oplog that
        is a tenth full will hold about ten times the time it holds now."""
        if self.size_bytes and self.max_bytes and self.size_bytes < self.max_bytes:
            return self.seconds * self.max_bytes / self.size_bytes
        return float(self.seconds)


def oplog_window(client: MongoClient) -> OplogWindow | None:
    """First and last entry of the oplog; None where it cannot be read (mongos, no privilege)."""
    try:
        oplog = client.local["oplog.rs"]
        first = oplog.find({}, {"ts": 1}).sort("$natural", 1).limit(1).next()
        last = oplog.find({}, {"ts": 1}).sort("$natural", -1).limit(1).next()
    except (PyMongoError, StopIteration):
        return None
    try:
        stats = client.local.command("collStats", "oplog.rs")
        size, max_size = int(stats.get("size", 0)), int(stats.get("maxSize", 0))
    except PyMongoError:
        size = max_size = 0
    return OplogWindow(first["ts"], last["ts"], size or None, max_size or None)


def _first_line(exc: Exception) -> str:
    return str(exc).split(",")[0].splitlines()[0][:300]
