"""The environment Dagster runs Tidemark in: every EnvVar the definitions read, with defaults.

`tidemark ui` and the demo fill in what is unset (the embedded mongod, the home's state store
and lake, the home's Spark Connect server) and give Dagster a persistent DAGSTER_HOME whose
instance limits each stream's concurrency pool to one running step.
"""

from __future__ import annotations

import os
from pathlib import Path

from tidemark.cli.runtime import resolve_mongodb_uri, resolve_spark_remote
from tidemark.settings import Settings

DAGSTER_YAML = """\
# Written by Tidemark: each stream's pool (tidemark_<stream>) runs one step at a time.
concurrency:
  pools:
    default_limit: 1
telemetry:
  enabled: false
"""


def dagster_home(settings: Settings) -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or settings.home / "dagster")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)
    return home


def dagster_environment(settings: Settings) -> dict[str, str]:
    """The variables to set for Dagster, on top of the current environment."""
    return {
        "MONGODB_URI": resolve_mongodb_uri(settings),
        "TIDEMARK_STATE_URL": settings.state_url,
        "TIDEMARK_LAKE": str(settings.lake_root),
        "TIDEMARK_SPARK_MASTER": settings.spark_master or "local[*]",
        "TIDEMARK_SPARK_REMOTE": resolve_spark_remote(settings),
        "TIDEMARK_CONFIG": str(settings.config_path),
        "DAGSTER_HOME": str(dagster_home(settings)),
    }
