"""Transform: committed raw batches -> the curated tables `changes` and `current`, with Spark.

`transform` runs one stream's transform (`run`): the change log (`change_log`), then a version
of `current` (`versions`), a delta or a base, merged by readers by the rule in `merge`;
`compact` rewrites a version's base and deltas as one base. `read_current` and `read_changes`
read the curated tables (`tables`). The fold's rule lives in `fold`, document columns in
`doc_columns`.

The names below are imported on first use: Spark's Python workers import the UDFs' modules
(`doc_columns`, `fold`) through this package, and must not pay for the state store, SQLAlchemy
and the config models (seconds per fresh worker) that `run` and `compact` need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.transform.compact import (
        CompactionResult,
        DeltaDebt,
        compact,
        delta_debt,
        needs_compaction,
    )
    from jobs.transform.readers import read_changes, read_current
    from jobs.transform.run import SparkSource, TransformResult, transform

_HOME = {
    "CompactionResult": "compact",
    "DeltaDebt": "compact",
    "compact": "compact",
    "delta_debt": "compact",
    "needs_compaction": "compact",
    "read_changes": "readers",
    "read_current": "readers",
    "SparkSource": "run",
    "TransformResult": "run",
    "transform": "run",
}

__all__ = [
    "CompactionResult",
    "DeltaDebt",
    "SparkSource",
    "TransformResult",
    "compact",
    "delta_debt",
    "needs_compaction",
    "read_changes",
    "read_current",
    "transform",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
