"""Thin Dagster `ConfigurableResource` wrappers over Tidemark's plain factories, and the one
function that builds the resource dict the definitions need.

The code location leaves every setting unset: a resource then reads its variable when a run
starts, with the README's defaults for the optional ones (`run_time_settings`), so every entry
point (`dagster dev`, `dagster job execute`, `dagster asset materialize`) needs no more than the
`tidemark` CLI does. Each run opens (and closes) its own connections.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr
from pymongo import MongoClient

from resources.embedded_mongo import ensure_embedded
from resources.mongo import connect
from resources.spark import REMOTE_ENV, SparkConfig, spark_session, stop_if_created
from state import StateStore
from tidemark.object_path import LakePath
from tidemark.settings import Settings, lake_path

_FROM_ENV = "unset: read from {} when a run starts ({})"


def run_time_settings() -> Settings:
    """The environment as the CLI reads it (TIDEMARK_HOME's defaults for what is unset)."""
    return Settings.from_env()


class MongoResource(dg.ConfigurableResource):
    """The MongoDB deployment to capture (a replica set or sharded cluster)."""

    uri: str | None = Field(
        default=None, description=_FROM_ENV.format("MONGODB_URI", "default: the embedded mongod")
    )
    server_selection_timeout_ms: int = 10_000

    def resolved_uri(self) -> str:
        if self.uri:
            return self.uri
        settings = run_time_settings()
        # As the CLI does: unset means the embedded mongod under the Tidemark home.
        return settings.mongodb_uri or ensure_embedded(settings.home).uri

    _raw: MongoClient | None = PrivateAttr(default=None)
    _plain: MongoClient | None = PrivateAttr(default=None)

    def raw_client(self) -> MongoClient:
        """Events as raw BSON, for draining."""
        if self._raw is None:
            self._raw = connect(
                self.resolved_uri(), timeout_ms=self.server_selection_timeout_ms, raw=True
            )
        return self._raw

    def client(self) -> MongoClient:
        """Plain documents, for counts and checks."""
        if self._plain is None:
            self._plain = connect(self.resolved_uri(), timeout_ms=self.server_selection_timeout_ms)
        return self._plain

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        for client in (self._raw, self._plain):
            if client is not None:
                client.close()


class StateStoreResource(dg.ConfigurableResource):
    """The SQL state store (SQLite file or PostgreSQL URL)."""

    url: str | None = Field(
        default=None,
        description=_FROM_ENV.format("TIDEMARK_STATE_URL", "default: $TIDEMARK_HOME/state.db"),
    )

    _store: StateStore | None = PrivateAttr(default=None)

    def store(self) -> StateStore:
        if self._store is None:
            self._store = StateStore(self.url or run_time_settings().state_url)
        return self._store

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()


class LakeResource(dg.ConfigurableResource):
    """The lake root (raw and curated zones): a local directory or an object store's URL."""

    root: str | None = Field(
        default=None, description=_FROM_ENV.format("TIDEMARK_LAKE", "default: $TIDEMARK_HOME/lake")
    )

    @property
    def path(self) -> LakePath:
        if self.root:
            return lake_path(self.root)
        return run_time_settings().lake_root


class SparkResource(dg.ConfigurableResource):
    """A SparkSession: local by default, a cluster master, or a Spark Connect remote (when
    `remote` is set, `master` is not used and no JVM starts in the run's process)."""

    master: str | None = Field(
        default=None, description=_FROM_ENV.format("TIDEMARK_SPARK_MASTER", "default: local[*]")
    )
    remote: str | None = Field(
        default=None,
        description=_FROM_ENV.format(REMOTE_ENV, "default: none, a driver JVM per run"),
    )
    driver_memory: str = "2g"

    def resolved(self) -> tuple[str, str | None]:
        """(master, remote): a value set on the resource wins, else the environment's."""
        remote = self.remote if self.remote is not None else os.environ.get(REMOTE_ENV)
        master = self.master or os.environ.get("TIDEMARK_SPARK_MASTER") or "local[*]"
        return master, remote or None

    _session: Any = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)

    def session(self) -> Any:
        if self._session is None:
            master, remote = self.resolved()
            config = SparkConfig(master=master, remote=remote, driver_memory=self.driver_memory)
            self._session, self._created = spark_session(config)
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        # Only a session this resource started is stopped: a shared one stays up.
        if self._session is not None:
            stop_if_created(self._session, self._created)


def build_resources(
    *,
    mongodb_uri: str | None = None,
    state_url: str | None = None,
    lake_root: str | None = None,
    spark_master: str | None = None,
    spark_remote: str | None = "",
) -> dict[str, Any]:
    """The resources the assets and checks ask for, keyed by their parameter names. A value
    left None is read from the environment when a run starts (see `env_resources`)."""
    return {
        "mongo": MongoResource(uri=mongodb_uri),
        "state": StateStoreResource(url=state_url),
        "lake": LakeResource(root=lake_root),
        "spark": SparkResource(master=spark_master, remote=spark_remote),
    }


def env_resources() -> dict[str, Any]:
    """The code location's resources: every setting from the environment, read at run time,
    each optional with the README's default. Not `EnvVar`s: Dagster refuses to start a run
    when an `EnvVar` is unset, and has no default for one."""
    return build_resources(spark_remote=None)
