"""Transform: committed raw batches -> each collection's Delta tables `changes` and `current`.

`transform` runs one stream's transform (`run`): the change log (`change_log`), then the fold
into `current` (`apply`, by the rules in `fold`), every Delta commit made once (`delta_io`);
`compact` is Delta's OPTIMIZE and purge. `read_current` and `read_changes` read the tables
(`readers`); document columns are typed in `doc_columns`.
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
