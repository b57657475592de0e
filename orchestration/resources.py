"""Thin Dagster `ConfigurableResource` wrappers over Tidemark's plain factories, and the one
function that builds the resource dict the definitions need.

The code location passes `EnvVar`s, so nothing is read at import time, and each run opens
(and closes) its own connections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr
from pymongo import MongoClient

from resources.mongo import connect
from resources.spark import SparkConfig, spark_session, stop_if_created
from state import StateStore
from tidemark.settings import lake_path


class MongoResource(dg.ConfigurableResource):
    """The MongoDB deployment to capture (a replica set or sharded cluster)."""

    uri: str
    server_selection_timeout_ms: int = 10_000

    _raw: MongoClient | None = PrivateAttr(default=None)
    _plain: MongoClient | None = PrivateAttr(default=None)

    def raw_client(self) -> MongoClient:
        """Events as raw BSON, for draining."""
        if self._raw is None:
            self._raw = connect(self.uri, timeout_ms=self.server_selection_timeout_ms, raw=True)
        return self._raw

    def client(self) -> MongoClient:
        """Plain documents, for counts and checks."""
        if self._plain is None:
            self._plain = connect(self.uri, timeout_ms=self.server_selection_timeout_ms)
        return self._plain

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        for client in (self._raw, self._plain):
            if client is not None:
                client.close()


class StateStoreResource(dg.ConfigurableResource):
    """The SQL state store (SQLite file or PostgreSQL URL)."""

    url: str

    _store: StateStore | None = PrivateAttr(default=None)

    def store(self) -> StateStore:
        if self._store is None:
            self._store = StateStore(self.url)
        return self._store

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()


class LakeResource(dg.ConfigurableResource):
    """The lake root directory (raw and curated zones)."""

    root: str

    @property
    def path(self) -> Path:
        return lake_path(self.root)


class SparkResource(dg.ConfigurableResource):
    """A SparkSession: local by default, a cluster master, or a Spark Connect remote (when
    `remote` is set, `master` is not used and no JVM starts in the run's process)."""

    master: str = "local[*]"
    remote: str = ""
    driver_memory: str = "2g"

    _session: Any = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)

    def session(self) -> Any:
        if self._session is None:
            config = SparkConfig(
                master=self.master, remote=self.remote or None, driver_memory=self.driver_memory
            )
            self._session, self._created = spark_session(config)
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        # Only a session this resource started is stopped: a shared one stays up.
        if self._session is not None:
            stop_if_created(self._session, self._created)


def build_resources(
    *,
    mongodb_uri: str | dg.EnvVar,
    state_url: str | dg.EnvVar,
    lake_root: str | dg.EnvVar,
    spark_master: str | dg.EnvVar,
    spark_remote: str | dg.EnvVar = "",
) -> dict[str, Any]:
    """The resources the assets and checks ask for, keyed by their parameter names. A value is
    a plain string (the demo, tests) or an `EnvVar`, which Dagster reads when a run starts."""
    return {
        "mongo": MongoResource(uri=mongodb_uri),
        "state": StateStoreResource(url=state_url),
        "lake": LakeResource(root=lake_root),
        "spark": SparkResource(master=spark_master, remote=spark_remote),
    }


def env_resources() -> dict[str, Any]:
    """The code location's resources: every setting from the environment, read at run time."""
    return build_resources(
        mongodb_uri=dg.EnvVar("MONGODB_URI"),
        state_url=dg.EnvVar("TIDEMARK_STATE_URL"),
        lake_root=dg.EnvVar("TIDEMARK_LAKE"),
        spark_master=dg.EnvVar("TIDEMARK_SPARK_MASTER"),
        spark_remote=dg.EnvVar("TIDEMARK_SPARK_REMOTE"),  # empty: none, use the master
    )
