"""Wiring for the CLI and the demo: settings -> config, state store, MongoDB client, lake,
Spark.

With `MONGODB_URI` unset, the embedded mongod under the Tidemark home is used (started on
first use), which is what the demo and a first try want; the CLI says so on stderr. Likewise
the demo and the UI use the home's long-lived Spark Connect server when neither
`TIDEMARK_SPARK_REMOTE` nor `TIDEMARK_SPARK_MASTER` is set.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pymongo import MongoClient

from resources.embedded_mongo import ensure_embedded
from resources.mongo import connect
from resources.spark import REMOTE_ENV
from resources.spark_server import start_server
from state import StateStore
from tidemark.config import TidemarkConfig, load_streams
from tidemark.errors import TidemarkError
from tidemark.object_path import LakePath
from tidemark.settings import Settings


def resolve_mongodb_uri(settings: Settings, announce: bool = True) -> str:
    if settings.mongodb_uri:
        return settings.mongodb_uri
    mongod = ensure_embedded(settings.home)
    if announce:
        print(
            f"MONGODB_URI is not set: using the embedded mongod at {mongod.uri} "
            f"(data in {mongod.dbpath}).",
            file=sys.stderr,
        )
    return mongod.uri


def resolve_spark_remote(settings: Settings, announce: bool = True) -> str:
    """The Spark Connect URL the pipeline's runs use, or "" for a driver JVM per process.

    `TIDEMARK_SPARK_REMOTE` wins; a `TIDEMARK_SPARK_MASTER` asks for JVMs of its own; with
    neither, the home's local Connect server, started when it does not run (10-20 s, once)
    and left running for the next runs.
    """
    if settings.spark_remote:
        return settings.spark_remote
    if settings.spark_master:
        return ""
    server, started = start_server(settings.home)
    if announce:
        print(
            f"{REMOTE_ENV} is not set: using the local Spark Connect server at {server.url} "
            + (
                f"(started; log {server.log}). It keeps running for the next runs; "
                "`tidemark spark stop` stops it."
                if started
                else f"(pid {server.pid})."
            ),
            file=sys.stderr,
        )
    return server.url


def load_config_per_stream(settings: Settings, announce: bool = True) -> TidemarkConfig:
    """The streams file's valid streams; a broken entry is named on stderr and a command on
    it fails with its message (exit 2), while commands on the others work."""
    streams_file = load_streams(settings.config_path)
    if announce and streams_file.streams:  # with none valid, `config()` raises the error
        for broken in streams_file.broken:
            print(f"tidemark: stream {broken.key!r} is skipped: {broken.error}", file=sys.stderr)
    return streams_file.config()


class Runtime:
    """What a command works with. MongoDB is reached on first use only: a transform, `tables`
    or `gc` never needs it, so none of them starts the embedded mongod or waits for a server."""

    def __init__(
        self, settings: Settings, config: TidemarkConfig, store: StateStore, announce: bool
    ) -> None:
        self.settings = settings
        self.config = config
        self.store = store
        self._announce = announce

    @cached_property
    def uri(self) -> str:
        return resolve_mongodb_uri(self.settings, self._announce)

    @cached_property
    def client(self) -> MongoClient:
        """Raw BSON documents, for draining."""
        return connect(self.uri, raw=True)

    @property
    def lake_root(self) -> LakePath:
        return self.settings.lake_root

    def close(self) -> None:
        if "client" in self.__dict__:
            self.client.close()
        self.store.close()


def open_runtime(settings: Settings | None = None, announce: bool = True) -> Runtime:
    settings = settings or Settings.from_env()
    config = load_config_per_stream(settings, announce)
    return Runtime(settings, config, StateStore(settings.state_url), announce)


@dataclass
class StreamFailures:
    """`--all` runs every stream whatever another one's fate: a stream that fails is a row
    marked FAILED and its message after the table, and the exit code says one failed (2 for
    Tidemark's errors; 1, with the traceback, for an unexpected one)."""

    failed: list[tuple[str, BaseException]] = field(default_factory=list)

    @classmethod
    def of(cls, config: TidemarkConfig) -> StreamFailures:
        """Starting with the streams file's broken entries: `--all` means every stream the
        file declares, and one that cannot even be read has failed."""
        return cls(failed=list(config.broken.items()))

    def run(self, stream: str, work: Callable[[], Any]) -> Any:
        try:
            return work()
        except Exception as exc:  # one stream's failure must not stop the others
            self.failed.append((stream, exc))
            return None

    def report(self) -> int:
        for stream, exc in self.failed:
            if isinstance(exc, TidemarkError):
                print(f"tidemark: stream {stream!r} failed: {exc}", file=sys.stderr)
            else:
                print(f"tidemark: stream {stream!r} failed unexpectedly:", file=sys.stderr)
                traceback.print_exception(exc, file=sys.stderr)
        if not self.failed:
            return 0
        return 2 if all(isinstance(e, TidemarkError) for _, e in self.failed) else 1
