"""Wiring for the CLI and the demo: settings -> config, state store, MongoDB client, lake.

With `MONGODB_URI` unset, the embedded mongod under the Tidemark home is used (started on
first use), which is what the demo and a first try want; the CLI says so on stderr.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from pymongo import MongoClient

from resources.embedded_mongo import ensure_embedded
from resources.mongo import connect
from state import StateStore
from tidemark.config import TidemarkConfig, load_config
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


@dataclass
class Runtime:
    settings: Settings
    config: TidemarkConfig
    store: StateStore
    client: MongoClient  # raw BSON documents, for draining
    uri: str

    @property
    def lake_root(self) -> Path:
        return self.settings.lake_root

    def close(self) -> None:
        self.client.close()
        self.store.close()


def open_runtime(settings: Settings | None = None, announce: bool = True) -> Runtime:
    settings = settings or Settings.from_env()
    config = load_config(settings.config_path)
    store = StateStore(settings.state_url)
    uri = resolve_mongodb_uri(settings, announce)
    client = connect(uri, raw=True)
    return Runtime(settings, config, store, client, uri)
