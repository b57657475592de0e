"""Transform: committed raw batches -> the curated tables `changes` and `current`, with Spark.

`transform` runs one stream's transform (`run`): the change log (`change_log`), then a version
of `current` (`versions`), a delta or a base, merged by readers by the rule in `merge`;
`compact` rewrites a version's base and deltas as one base. `read_current` and `read_changes`
read the curated tables (`tables`). The fold's rule lives in `fold`, document columns in
`doc_columns`.
"""

from jobs.transform.compact import (
    CompactionResult,
    DeltaDebt,
    compact,
    delta_debt,
    needs_compaction,
)
from jobs.transform.readers import read_changes, read_current
from jobs.transform.run import SparkSource, TransformResult, transform

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
