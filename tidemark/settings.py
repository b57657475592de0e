"""Where Tidemark keeps things: the home directory and the locations derived from it.

Everything generated (embedded mongod data, the SQLite state store, the lake) lives under
the Tidemark home unless an environment variable points elsewhere, so one `rm -rf` resets a
demo and nothing generated lands in the source tree by accident.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def tidemark_home() -> Path:
    """`TIDEMARK_HOME`, else `~/.tidemark`."""
    raw = os.environ.get("TIDEMARK_HOME")
    return Path(raw).expanduser().resolve() if raw else Path.home() / ".tidemark"


@dataclass(frozen=True)
class Settings:
    """The environment-derived locations one Tidemark process works with."""

    home: Path
    config_path: Path
    state_url: str
    lake_root: Path
    mongodb_uri: str | None
    spark_master: str | None  # a Spark master: each process starts its own driver JVM
    spark_remote: str | None  # a Spark Connect server (sc://host:port): no JVM here

    @classmethod
    def from_env(cls) -> Settings:
        home = tidemark_home()
        config = os.environ.get("TIDEMARK_CONFIG", "streams.yaml")
        state_url = os.environ.get("TIDEMARK_STATE_URL") or f"sqlite:///{home / 'state.db'}"
        lake = os.environ.get("TIDEMARK_LAKE") or str(home / "lake")
        return cls(
            home=home,
            config_path=Path(config).expanduser().resolve(),
            state_url=state_url,
            lake_root=Path(lake).expanduser().resolve(),
            mongodb_uri=os.environ.get("MONGODB_URI") or None,
            spark_master=os.environ.get("TIDEMARK_SPARK_MASTER") or None,
            spark_remote=os.environ.get("TIDEMARK_SPARK_REMOTE") or None,
        )
